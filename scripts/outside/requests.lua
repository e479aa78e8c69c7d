-- wrk's requests for scripts/outside/run.sh. OUTSIDE_MODE picks them:
--   forgot  POST /v1/auth/forgot-password, each request from a new client IP (X-Forwarded-For in
--           10.0.0.0/8; the service trusts 127.0.0.1 as a proxy) with a new unknown email: two
--           rate-limit checks on fresh keys and a user lookup;
--   limits  POST /v1/limits/outside with a new key (bearer OUTSIDE_TOKEN): one check on a fresh
--           key, the custom action RATE_LIMIT_OUTSIDE_KEY.
-- OUTSIDE_THREADS is wrk's -t (the threads share out the addresses), OUTSIDE_TAG makes this run's
-- emails and keys its own. done() prints one line, "outside key=value ...", which run.sh reads.

local mode = os.getenv("OUTSIDE_MODE") or "forgot"
local tag = os.getenv("OUTSIDE_TAG") or "run"
local token = os.getenv("OUTSIDE_TOKEN") or ""
local threads = tonumber(os.getenv("OUTSIDE_THREADS") or "1")

local count = 0

function setup(thread)
  thread:set("id", count)
  count = count + 1
end

-- Set in each thread's own environment by setup.
id = 0
local n = 0

local forgotHeaders = { ["Content-Type"] = "application/json" }
local limitsHeaders = { ["Content-Type"] = "application/json", ["Authorization"] = "Bearer " .. token }

function request()
  n = n + 1
  if mode == "limits" then
    return wrk.format("POST", "/v1/limits/outside", limitsHeaders,
      string.format('{"key":"outside-%s-%d-%d"}', tag, id, n))
  end
  -- Thread id's n-th address of 10.0.0.0/8; 2^24 of them before any repeats.
  local i = (n * threads + id) % 16777216
  forgotHeaders["X-Forwarded-For"] = string.format("10.%d.%d.%d",
    math.floor(i / 65536) % 256, math.floor(i / 256) % 256, i % 256)
  return wrk.format("POST", "/v1/auth/forgot-password", forgotHeaders,
    string.format('{"email":"outside-%s-%d-%d@example.com"}', tag, id, n))
end

function done(summary, latency)
  local e = summary.errors
  io.write(string.format(
    "outside requests=%d duration_us=%d status_errors=%d connect=%d read=%d write=%d timeout=%d " ..
    "p50_us=%d p90_us=%d p99_us=%d max_us=%d\n",
    summary.requests, summary.duration, e.status, e.connect, e.read, e.write, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
