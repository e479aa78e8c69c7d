package abuse

import "time"

// window is one fixed window of a rule: [start, end).
type window struct {
	start time.Time
	end   time.Time
}

// windowAt returns the fixed window of size containing now, aligned on the Unix epoch:
// start = floor(now / size) * size. Every API process computes the same window for the same
// instant, so they all count into the same row. size must be positive.
func windowAt(now time.Time, size time.Duration) window {
	// Nanoseconds since the epoch fit an int64 until the year 2262; floor division keeps the
	// math right before 1970 too (only tests go there).
	ns, sz := now.UnixNano(), int64(size)
	start := ns / sz * sz
	if start > ns {
		start -= sz
	}
	return window{
		start: time.Unix(0, start).UTC(),
		end:   time.Unix(0, start+sz).UTC(),
	}
}

// ceilSeconds rounds d up to whole seconds, and to at least 1: a client told to retry after 0
// seconds would come back inside the window it was refused in.
func ceilSeconds(d time.Duration) int64 {
	s := int64(d / time.Second)
	if d%time.Second > 0 {
		s++
	}
	return max(s, 1)
}
