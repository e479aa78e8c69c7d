package main

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/postguard/postguard/api"
	"github.com/postguard/postguard/api/abuse"
	"github.com/postguard/postguard/api/abuse/abuseprom"
	"github.com/postguard/postguard/db"
)

// The redis/http-many-ips baseline: the very forgot-password requests of http-many-ips, served by
// the same service, except that the limiter counts in Redis through github.com/go-redis/redis_rate
// instead of the database. Redis is a comparison only: nothing outside this command imports it.

const (
	redisURLFallback = "redis://127.0.0.1:6379/0"
	// redisPingTimeout bounds the look for a Redis server; without one the row is skipped.
	redisPingTimeout = time.Second
	// redisMaxLimit is the most requests a window is given in Redis. redis_rate's GCRA runs in
	// Lua doubles of seconds since 2017 (about 2.9e8, resolution 6e-8 s): at the rules' unlimited
	// (2^40 in 15 minutes) one request's emission interval falls under that resolution, the
	// script then writes nothing, and the baseline would cost a read where a limiter writes. At
	// 2^30 a window every Allow reads and writes its key, and no run comes near it
	// (maxRequestsPerScenario).
	redisMaxLimit = 1 << 30
)

// userGetter reads a user by normalised email, db.ErrNotFound when there is none: the store's.
type userGetter interface {
	UserGetByEmail(ctx context.Context, email string) (*db.User, error)
}

// redisConsumer is an abuse.Consumer on redis_rate, written as an application using that library
// would: one Limiter.Allow (one round trip) per check, in order, each only when the ones before it
// admitted, then the user read from the database. A request of http-many-ips then costs two Redis
// round trips and one database round trip, where postguard's own limiter spends its checks in one
// database round trip.
type redisConsumer struct {
	limiter *redis_rate.Limiter
	users   userGetter
}

var _ abuse.Consumer = (*redisConsumer)(nil)

func newRedisConsumer(rdb *redis.Client, users userGetter) *redisConsumer {
	return &redisConsumer{limiter: redis_rate.NewLimiter(rdb), users: users}
}

// redisKey is a window's key: the counter key in hex and the window's start.
func redisKey(keyHash []byte, windowStart time.Time) string {
	return hex.EncodeToString(keyHash) + ":" + strconv.FormatInt(windowStart.Unix(), 10)
}

// redisLimit is the window's limit in redis_rate's terms: LimitCount requests (at most
// redisMaxLimit), all of them at once (burst), over the window's length.
func redisLimit(w *db.RateLimitCounterConsumeParams) redis_rate.Limit {
	limit := int(min(w.LimitCount, redisMaxLimit))
	return redis_rate.Limit{Rate: limit, Burst: limit, Period: w.WindowEnd.Sub(w.WindowStart)}
}

func (c *redisConsumer) RateLimitCounterConsumeChain(ctx context.Context, params *db.RateLimitCounterChainParams) (*db.RateLimitCounterChainResult, error) {
	res := &db.RateLimitCounterChainResult{Counts: make([]int64, 0, len(params.Windows))}
	for i := range params.Windows {
		w := &params.Windows[i]
		limit := redisLimit(w)
		allowed, err := c.limiter.Allow(ctx, redisKey(w.KeyHash, w.WindowStart), limit)
		if err != nil {
			return nil, fmt.Errorf("error consuming rate limit in Redis: %w", err)
		}
		if allowed.Allowed == 0 {
			return res, nil // this window refused; the ones after it are not spent
		}
		// GCRA refills as time passes, so limit − remaining is the window's count as redis_rate
		// sees it; an admitted request counts at least itself.
		res.Counts = append(res.Counts, int64(max(limit.Rate-allowed.Remaining, 1)))
	}
	if params.UserEmail != "" {
		user, err := c.users.UserGetByEmail(ctx, params.UserEmail)
		switch {
		case errors.Is(err, db.ErrNotFound):
		case err != nil:
			return nil, fmt.Errorf("error looking up user: %w", err)
		default:
			res.User = user
		}
	}
	return res, nil
}

// errRedisUnsupported: redis_rate has no read that spends nothing, no refund and no devices, and
// forgot-password (the baseline's scenario) needs none of them.
var errRedisUnsupported = errors.New("not supported by the redis_rate baseline")

func (c *redisConsumer) RateLimitCounterGetMany(context.Context, *db.RateLimitCounterWindowsParams) (*db.RateLimitCounterGetManyResult, error) {
	return nil, errRedisUnsupported
}

func (c *redisConsumer) RateLimitCounterRefund(context.Context, *db.RateLimitCounterWindowsParams) (bool, error) {
	return false, errRedisUnsupported
}

func (c *redisConsumer) RateLimitDeviceRevocationGet(context.Context, []byte) (time.Time, error) {
	return time.Time{}, errRedisUnsupported
}

func (c *redisConsumer) RateLimitDeviceRevocationUpsert(context.Context, []byte) error {
	return errRedisUnsupported
}

// RateLimitCounterDeleteMany resets each window (no device: see errRedisUnsupported).
func (c *redisConsumer) RateLimitCounterDeleteMany(ctx context.Context, params *db.RateLimitCounterWindowsParams) (bool, error) {
	if params.Device != nil {
		return false, errRedisUnsupported
	}
	for _, w := range params.Windows {
		if err := c.RateLimitCounterDelete(ctx, &db.RateLimitCounterDeleteParams{KeyHash: w.KeyHash, WindowStart: w.WindowStart, WindowEnd: w.WindowEnd}); err != nil {
			return false, err
		}
	}
	return false, nil
}

func (c *redisConsumer) RateLimitCounterDelete(ctx context.Context, params *db.RateLimitCounterDeleteParams) error {
	if err := c.limiter.Reset(ctx, redisKey(params.KeyHash, params.WindowStart)); err != nil {
		return fmt.Errorf("error resetting rate limit in Redis: %w", err)
	}
	return nil
}

// connectRedis returns a client of the Redis at redisURL (go-redis's defaults: a pool of 10 ×
// GOMAXPROCS connections), once it answers a PING within redisPingTimeout, and the server's
// address. The error says why there is none.
func connectRedis(ctx context.Context, redisURL string) (*redis.Client, string, error) {
	redis.SetLogger(quietRedisLogger{})
	opt, err := redis.ParseURL(redisURL)
	if err != nil {
		return nil, "", fmt.Errorf("error parsing -redis-url: %w", err)
	}
	rdb := redis.NewClient(opt)
	pingCtx, cancel := context.WithTimeout(ctx, redisPingTimeout)
	defer cancel()
	if err := rdb.Ping(pingCtx).Err(); err != nil {
		_ = rdb.Close()
		return nil, opt.Addr, err
	}
	return rdb, opt.Addr, nil
}

// quietRedisLogger drops go-redis's own log lines, which would break into the progress lines on
// stderr: a failed dial reaches the report as the skip note, a failed command as the row's first
// error.
type quietRedisLogger struct{}

func (quietRedisLogger) Printf(context.Context, string, ...any) {}

// redisManyIPs measures redis/http-many-ips: http-many-ips's requests with the limiter on Redis,
// the user lookup on the run's database. Without a Redis server the row is skipped, and the
// report says why.
func (r *runner) redisManyIPs(ctx context.Context, d *database) error {
	rdb, addr, err := connectRedis(ctx, r.opts.RedisURL)
	if err != nil {
		r.report.Notes = append(r.report.Notes, fmt.Sprintf("%s: skipped: no Redis at %s: %v", rowRedis, addr, err))
		return nil
	}
	defer rdb.Close()

	var limiterErr error
	h, err := r.startHeld(ctx, d, rowRedis, &serviceOpts{
		apiConfigFunc: func(config *api.Config) {
			consumer := newRedisConsumer(rdb, config.Store)
			metrics, err := abuseprom.Register(config.Registerer)
			if err == nil {
				config.Limiter, err = abuse.NewLimiter(consumer, config.Secret, config.Limiter.Rules(), &abuse.LimiterConfig{Metrics: metrics})
			}
			limiterErr = err
		},
	})
	if limiterErr != nil {
		return fmt.Errorf("error building the redis_rate limiter: %w", limiterErr)
	}
	if err != nil {
		return err
	}
	defer h.close()
	s := h.measure(ctx, "", r.opts.Duration)
	h.close()

	// Added after http-many-ips's row, which is measured around this one (see later).
	r.later(nil, func() {
		row := r.heldRow(rowRedis, s, d.engine, fmt.Sprintf(
			"%s, with the limiter's two checks in Redis at %s by github.com/go-redis/redis_rate v10 (GCRA; one Allow, so one round "+
				"trip, per check; limits above %d a window given as %d; go-redis's default pool) and the user lookup on the run's %s "+
				"database: 2 Redis round trips + 1 database round trip", manyIPsNote, addr, redisMaxLimit, redisMaxLimit, d.engine))
		if s.requests > 0 && s.cpu.redis > 0 { // a Redis server on this machine
			v := round(float64(s.cpu.redis.Microseconds())/float64(s.requests), 1)
			row.RedisCPUPerRequestUS = &v
			row.addNote(fmt.Sprintf("the Redis server's CPU: %.0fµs/req (not in DB CPU/req, which is PostgreSQL's)", v))
		}
		r.report.Rows = append(r.report.Rows, row)
		r.compareWithRedis(row)
	}, nil)
	return nil
}
