// Package bursttest runs a burst of concurrent guesses at one account's password, for the tests
// that show a login guard holds whatever the concurrency: postguard's limits API, package
// ginlimit and the example host app, on both engines and across processes.
//
// The burst is arranged with gates, never timed: the login under test checks each password
// through a Checker, which holds every check until the whole burst has either reached a check or
// been answered, and only then lets them finish. A guard that admits attempts before counting
// them (peek, check, spend on a failure) lets every attempt reach the check; one that spends
// first lets at most its limit through, and the rest are answered while those are held.
package bursttest

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Password is the i-th password of a burst: password-0, password-1, …
func Password(i int) string { return fmt.Sprintf("password-%d", i) }

// Burst is a burst of Attempts logins at one account, with the passwords Password(0) to
// Password(Attempts-1), the account's own being Password(Right).
type Burst struct {
	Attempts int
	Right    int
	// Limit is the guard's limit of attempts per account: the right password's attempt starts
	// once Limit checks are held (or every other attempt was answered), so that it is not among
	// the first Limit, which a guard rightly lets through.
	Limit int
}

// Result is what a burst did.
type Result struct {
	// Statuses are the attempts' HTTP statuses, by position.
	Statuses []int
	// Checks is how many passwords the login checked.
	Checks int
	// Found says the right password's attempt succeeded (200).
	Found bool
}

// Counts are the result's statuses, counted.
func (r *Result) Counts() map[int]int {
	counts := map[int]int{}
	for _, status := range r.Statuses {
		counts[status]++
	}
	return counts
}

// Checker stands before the password check of the login under test: the login calls Check with
// each password it is about to check. Make one per burst with NewChecker.
type Checker struct {
	checks  atomic.Int64
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

// NewChecker returns a Checker whose checks are held until Run releases them.
func NewChecker() *Checker {
	return &Checker{entered: make(chan struct{}, 1<<16), release: make(chan struct{})}
}

// Check records a password check and holds it until the burst is released (at once when no burst
// runs: after Run, or for a login made before it).
func (c *Checker) Check(string) {
	c.checks.Add(1)
	c.entered <- struct{}{}
	<-c.release
}

// Released lets every check through from now on, without a burst.
func (c *Checker) Released() *Checker {
	c.once.Do(func() { close(c.release) })
	return c
}

// watchdog bounds a burst that hangs (a deadlock): a failure, not a way to wait.
const watchdog = 5 * time.Minute

// Run makes burst's attempts with login (which returns the attempt's HTTP status), all at once
// but the right password's, which starts once burst.Limit checks are held, and releases the checks
// when every attempt is at a check or answered. Logins made before Run must not have checked a
// password through c (release it with Released instead).
func (c *Checker) Run(t testing.TB, burst Burst, login func(i int, password string) int) *Result {
	t.Helper()
	if burst.Right < 0 || burst.Right >= burst.Attempts {
		t.Fatalf("bursttest: the right password's position %d is not among %d attempts", burst.Right, burst.Attempts)
	}
	statuses := make([]int, burst.Attempts)
	done := make(chan struct{}, burst.Attempts)
	start := make(chan struct{})
	var wg sync.WaitGroup
	attempt := func(i int) {
		wg.Go(func() {
			<-start
			statuses[i] = login(i, Password(i))
			done <- struct{}{}
		})
	}
	for i := range burst.Attempts {
		if i != burst.Right {
			attempt(i)
		}
	}
	close(start)

	timeout := time.After(watchdog)
	entered, answered := 0, 0
	await := func(until func() bool) {
		t.Helper()
		for !until() {
			select {
			case <-c.entered:
				entered++
			case <-done:
				answered++
			case <-timeout:
				c.Released()
				t.Fatalf("bursttest: the burst hung with %d checks held and %d attempts answered", entered, answered)
			}
		}
	}
	await(func() bool { return entered >= burst.Limit || entered+answered == burst.Attempts-1 })
	attempt(burst.Right)
	await(func() bool { return entered+answered == burst.Attempts })
	c.Released()
	wg.Wait()

	result := &Result{Statuses: statuses, Checks: int(c.checks.Load()), Found: statuses[burst.Right] == 200}
	t.Logf("bursttest: %d logins, the right password at %d: %d passwords checked, statuses %v, right password found: %t",
		burst.Attempts, burst.Right, result.Checks, result.Counts(), result.Found)
	return result
}
