package batch

import (
	"context"
	"errors"
	"slices"
	"testing"
)

// item is a test call: a name and the keys it touches.
type item struct {
	name string
	keys []string
}

func it(name string, keys ...string) item { return item{name: name, keys: keys} }

// started is a batch that Run received and holds until the test releases it.
type started struct {
	names   []string
	ctx     context.Context
	release chan error // nil: answer each item with its name
}

// gated is a Batcher whose Run holds every batch until the test releases it, and tells the test
// of each batch it starts and each call it queues. Nothing waits on time.
type gated struct {
	*Batcher[item, string]
	started chan *started
	queued  chan int
}

func newGated(t *testing.T, maxInFlight, maxSize int) *gated {
	t.Helper()
	g := &gated{started: make(chan *started, 16), queued: make(chan int, 16)}
	g.Batcher = New(Config[item, string]{
		Run: func(ctx context.Context, items []item) ([]string, error) {
			s := &started{ctx: ctx, release: make(chan error)}
			for _, i := range items {
				s.names = append(s.names, i.name)
			}
			g.started <- s
			if err := <-s.release; err != nil {
				return nil, err
			}
			return s.names, nil
		},
		Keys: func(i item) [][]byte {
			keys := make([][]byte, len(i.keys))
			for k, key := range i.keys {
				keys[k] = []byte(key)
			}
			return keys
		},
		MaxInFlight: maxInFlight,
		MaxSize:     maxSize,
		Queued:      func(n int) { g.queued <- n },
	})
	return g
}

// answer is what one Do returned.
type answer struct {
	result string
	err    error
}

// do calls Do in a goroutine and returns where its answer arrives.
func (g *gated) do(ctx context.Context, i item) <-chan answer {
	answers := make(chan answer, 1)
	go func() {
		result, err := g.Do(ctx, i)
		answers <- answer{result, err}
	}()
	return answers
}

// doQueued is do, returning once the call waits in the queue, which then holds n calls.
func (g *gated) doQueued(t *testing.T, ctx context.Context, i item, n int) <-chan answer {
	t.Helper()
	answers := g.do(ctx, i)
	if got := <-g.queued; got != n {
		t.Fatalf("queue after %s holds %d calls, want %d", i.name, got, n)
	}
	return answers
}

func (g *gated) nextBatch(t *testing.T, want ...string) *started {
	t.Helper()
	s := <-g.started
	if !slices.Equal(s.names, want) {
		t.Fatalf("batch = %v, want %v", s.names, want)
	}
	return s
}

func (g *gated) inFlight() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.Batcher.inFlight
}

func wantAnswer(t *testing.T, answers <-chan answer, want string) {
	t.Helper()
	a := <-answers
	if a.err != nil || a.result != want {
		t.Fatalf("answer = %q, %v; want %q", a.result, a.err, want)
	}
}

func TestDo_IdleCallRunsAtOnce(t *testing.T) {
	t.Parallel()
	g := newGated(t, 1, 8)

	answers := g.do(t.Context(), it("a", "k1"))
	batch := g.nextBatch(t, "a") // no other call was needed to start it, and none waited
	close(batch.release)
	wantAnswer(t, answers, "a")
	select {
	case n := <-g.queued:
		t.Fatalf("an idle call was queued (queue %d)", n)
	default:
	}
}

func TestDo_CallsArrivingInFlightShareTheNextBatch(t *testing.T) {
	t.Parallel()
	g := newGated(t, 1, 8)

	a := g.do(t.Context(), it("a", "k1"))
	first := g.nextBatch(t, "a")
	b := g.doQueued(t, t.Context(), it("b", "k2"), 1)
	c := g.doQueued(t, t.Context(), it("c", "k3"), 2)
	d := g.doQueued(t, t.Context(), it("d", "k4"), 3)

	close(first.release)
	wantAnswer(t, a, "a")
	second := g.nextBatch(t, "b", "c", "d")
	close(second.release)
	wantAnswer(t, b, "b")
	wantAnswer(t, c, "c")
	wantAnswer(t, d, "d")
}

func TestDo_BatchIsBounded(t *testing.T) {
	t.Parallel()
	g := newGated(t, 1, 2)

	a := g.do(t.Context(), it("a", "k1"))
	first := g.nextBatch(t, "a")
	var queued []<-chan answer
	for i, name := range []string{"b", "c", "d", "e", "f"} {
		queued = append(queued, g.doQueued(t, t.Context(), it(name, "key-"+name), i+1))
	}

	close(first.release)
	wantAnswer(t, a, "a")
	close(g.nextBatch(t, "b", "c").release)
	close(g.nextBatch(t, "d", "e").release)
	close(g.nextBatch(t, "f").release)
	for i, name := range []string{"b", "c", "d", "e", "f"} {
		wantAnswer(t, queued[i], name)
	}
}

func TestDo_KeyIsOncePerBatchInArrivalOrder(t *testing.T) {
	t.Parallel()
	g := newGated(t, 1, 8)

	a := g.do(t.Context(), it("a", "k1"))
	first := g.nextBatch(t, "a")
	b := g.doQueued(t, t.Context(), it("b", "k1"), 1)       // k1 twice: waits for a's batch
	c := g.doQueued(t, t.Context(), it("c", "k2"), 2)       //
	d := g.doQueued(t, t.Context(), it("d", "k3", "k1"), 3) // k1 a third time: after b
	e := g.doQueued(t, t.Context(), it("e", "k3"), 4)       // k3 after d, which waits on k1
	f := g.doQueued(t, t.Context(), it("f", "k4"), 5)

	close(first.release)
	wantAnswer(t, a, "a")
	second := g.nextBatch(t, "b", "c", "f")
	close(second.release)
	third := g.nextBatch(t, "d")
	close(third.release)
	fourth := g.nextBatch(t, "e")
	close(fourth.release)
	for _, w := range []struct {
		answers <-chan answer
		name    string
	}{{b, "b"}, {c, "c"}, {d, "d"}, {e, "e"}, {f, "f"}} {
		wantAnswer(t, w.answers, w.name)
	}
}

func TestDo_KeyInFlightWaitsWhileOthersGo(t *testing.T) {
	t.Parallel()
	g := newGated(t, 2, 8)

	a := g.do(t.Context(), it("a", "k1"))
	first := g.nextBatch(t, "a")
	// A free slot, but b's key is in flight: b waits, and so does c behind it on k2, although
	// c's own key k2 is in no batch.
	b := g.doQueued(t, t.Context(), it("b", "k1", "k2"), 1)
	c := g.doQueued(t, t.Context(), it("c", "k2"), 2)
	if n := g.inFlight(); n != 1 {
		t.Fatalf("%d batches in flight, want 1: a call overtook an earlier one of its key", n)
	}
	// d shares no key with anything queued or in flight: it takes the free slot at once.
	d := g.do(t.Context(), it("d", "k3"))
	other := g.nextBatch(t, "d")
	close(other.release)
	wantAnswer(t, d, "d")

	close(first.release)
	wantAnswer(t, a, "a")
	close(g.nextBatch(t, "b").release)
	close(g.nextBatch(t, "c").release)
	wantAnswer(t, b, "b")
	wantAnswer(t, c, "c")
}

func TestDo_CancelledWhileQueuedNeverRuns(t *testing.T) {
	t.Parallel()
	g := newGated(t, 1, 8)

	a := g.do(t.Context(), it("a", "k1"))
	first := g.nextBatch(t, "a")
	ctx, cancel := context.WithCancel(t.Context())
	b := g.doQueued(t, ctx, it("b", "k2"), 1)
	c := g.doQueued(t, t.Context(), it("c", "k3"), 2)

	cancel()
	if got := <-b; !errors.Is(got.err, context.Canceled) {
		t.Fatalf("cancelled call answered %q, %v; want context.Canceled", got.result, got.err)
	}
	close(first.release)
	wantAnswer(t, a, "a")
	second := g.nextBatch(t, "c") // b left the queue
	close(second.release)
	wantAnswer(t, c, "c")
}

func TestDo_CancelledInFlightAnswersAtOnceAndTheBatchGoesOn(t *testing.T) {
	t.Parallel()
	g := newGated(t, 1, 8)

	x := g.do(t.Context(), it("x", "k0"))
	first := g.nextBatch(t, "x")
	ctx, cancel := context.WithCancel(t.Context())
	a := g.doQueued(t, t.Context(), it("a", "k1"), 1)
	b := g.doQueued(t, ctx, it("b", "k2"), 2)
	close(first.release)
	wantAnswer(t, x, "x")
	second := g.nextBatch(t, "a", "b")

	cancel()
	if got := <-b; !errors.Is(got.err, context.Canceled) { // answered while the batch is held
		t.Fatalf("cancelled call answered %q, %v; want context.Canceled", got.result, got.err)
	}
	if err := second.ctx.Err(); err != nil {
		t.Fatalf("batch's context ended (%v) while a still waits for it", err)
	}
	close(second.release)
	wantAnswer(t, a, "a")
}

func TestDo_BatchContextEndsWhenNoCallerWaits(t *testing.T) {
	t.Parallel()
	g := newGated(t, 1, 8)

	x := g.do(t.Context(), it("x", "k0"))
	first := g.nextBatch(t, "x")
	ctxA, cancelA := context.WithCancel(t.Context())
	ctxB, cancelB := context.WithCancel(t.Context())
	a := g.doQueued(t, ctxA, it("a", "k1"), 1)
	b := g.doQueued(t, ctxB, it("b", "k2"), 2)
	close(first.release)
	wantAnswer(t, x, "x")
	batch := g.nextBatch(t, "a", "b")

	cancelA()
	if got := <-a; !errors.Is(got.err, context.Canceled) {
		t.Fatalf("answer = %v, want context.Canceled", got.err)
	}
	if err := batch.ctx.Err(); err != nil {
		t.Fatalf("batch's context ended (%v) while b still waits for it", err)
	}
	cancelB()
	if got := <-b; !errors.Is(got.err, context.Canceled) {
		t.Fatalf("answer = %v, want context.Canceled", got.err)
	}
	<-batch.ctx.Done() // the statement is cancelled: nobody waits for it
	close(batch.release)

	// The Batcher goes on: the slot is free again.
	c := g.do(t.Context(), it("c", "k1"))
	close(g.nextBatch(t, "c").release)
	wantAnswer(t, c, "c")
}

func TestDo_IdleCallRunsUnderItsOwnContext(t *testing.T) {
	t.Parallel()
	g := newGated(t, 1, 8)

	// A call alone runs on its caller's goroutine, under its caller's context: cancelling it
	// cancels its statement (which answers with the cancellation, as a real one would).
	ctx, cancel := context.WithCancel(t.Context())
	a := g.do(ctx, it("a", "k1"))
	batch := g.nextBatch(t, "a")
	cancel()
	<-batch.ctx.Done()
	batch.release <- context.Canceled
	if got := <-a; !errors.Is(got.err, context.Canceled) {
		t.Fatalf("answer = %v, want context.Canceled", got.err)
	}

	b := g.do(t.Context(), it("b", "k1")) // its slot and key are free again
	close(g.nextBatch(t, "b").release)
	wantAnswer(t, b, "b")
}

func TestDo_FailedRunFailsEveryCallOfTheBatch(t *testing.T) {
	t.Parallel()
	g := newGated(t, 1, 8)

	x := g.do(t.Context(), it("x", "k0"))
	first := g.nextBatch(t, "x")
	a := g.doQueued(t, t.Context(), it("a", "k1"), 1)
	b := g.doQueued(t, t.Context(), it("b", "k2"), 2)
	close(first.release)
	wantAnswer(t, x, "x")

	failure := errors.New("statement failed")
	g.nextBatch(t, "a", "b").release <- failure
	for _, answers := range []<-chan answer{a, b} {
		if got := <-answers; !errors.Is(got.err, failure) {
			t.Fatalf("answer = %q, %v; want the batch's error", got.result, got.err)
		}
	}

	c := g.do(t.Context(), it("c", "k1")) // the failed batch's keys are free again
	close(g.nextBatch(t, "c").release)
	wantAnswer(t, c, "c")
}

func TestDo_ItemWithOneKeyTwice(t *testing.T) {
	t.Parallel()
	g := newGated(t, 1, 8)

	if _, err := g.Do(t.Context(), it("a", "k1", "k1")); !errors.Is(err, ErrDuplicateKey) {
		t.Fatalf("err = %v, want ErrDuplicateKey", err)
	}
}
