package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/postguard/postguard/api/abuse"
	"github.com/postguard/postguard/cmd/internal/service"
	"github.com/postguard/postguard/db"
	"github.com/postguard/postguard/internal/riverstore"
	"github.com/postguard/postguard/jobs"
	"github.com/postguard/postguard/jobs/mail"
	"github.com/postguard/postguard/jobs/mail/resendfake"
	"github.com/postguard/postguard/jobs/mail/smtpfake"
)

const (
	rowDrainNoop   = "email-drain/noop"
	rowDrainResend = "email-drain/resend"
	rowDrainSMTP   = "email-drain/smtp"
	rowDrainBudget = "email-drain/budget"

	// drainUserHash is the password hash of the users the drain creates directly: never checked.
	drainUserHash = "$argon2id$v=19$m=19456,t=2,p=1$bG9hZGxvYWRsb2FkbG9hZA$bG9hZGxvYWRsb2FkbG9hZGxvYWRsb2FkbG9hZGxvYWQ"

	resendAPIKey = "re_load_test"
	resendFrom   = "postguard load <no-reply@example.com>"
)

// noopSender accepts every message at once: the workers' own cost, without a provider.
type noopSender struct{}

func (noopSender) Send(context.Context, *mail.Message) (string, error) { return "noop", nil }

// emailDrain measures how fast the real workers drain verification mails: into resendfake
// through the real resend-go client, compared with the same workers on a no-op sender; then
// paced under a budget the fake enforces.
func (r *runner) emailDrain(ctx context.Context) error {
	d, cleanup, err := r.newDatabase(ctx, r.engine, "mail")
	if err != nil {
		return err
	}
	defer cleanup()

	noop, err := r.drainPhase(ctx, d, &drainPhase{name: rowDrainNoop, sender: noopSender{}, mails: r.opts.Mails})
	if err != nil {
		return err
	}
	noopRow := noop.row(rowDrainNoop, r.opts.EmailWorkers, d.engine)
	noopRow.addNote("no-op mail.Sender: River, the user lookup, the token upsert and the rendering only")
	r.report.Rows = append(r.report.Rows, noopRow)

	fake := resendfake.New(nil, nil)
	defer fake.Close()
	sender, err := mail.NewResendSender(&mail.ResendConfig{APIKey: resendAPIKey, From: resendFrom, BaseURL: fake.URL()})
	if err != nil {
		return fmt.Errorf("error creating Resend sender: %w", err)
	}
	resend, err := r.drainPhase(ctx, d, &drainPhase{name: rowDrainResend, sender: sender, mails: r.opts.Mails})
	if err != nil {
		return err
	}
	resendRow := resend.row(rowDrainResend, r.opts.EmailWorkers, d.engine)
	resendRow.addNote("ResendSender (resend-go, production HTTP client) into resendfake, unpaced (RESEND_MAX_RPS=0)")
	if delivered := len(fake.Deliveries()); int64(delivered) != resend.completed {
		resendRow.addNote(fmt.Sprintf("the fake holds %d deliveries for %d completed jobs", delivered, resend.completed))
		resendRow.Errors++
	}
	r.report.Rows = append(r.report.Rows, resendRow)
	r.report.compare(resendRow, rowDrainNoop, targetDrainResend)

	if err := r.drainSMTP(ctx, d); err != nil {
		return err
	}
	return r.drainBudget(ctx, d)
}

// drainSMTP drains into smtpfake, a real SMTP server in-process, through the SMTP sender as
// MAILER=smtp builds it: STARTTLS and AUTH on a connection of its own for every mail, unpaced.
func (r *runner) drainSMTP(ctx context.Context, d *database) error {
	fake := smtpfake.New(nil, &smtpfake.Config{Username: "postguard", Password: "load"})
	defer fake.Close()
	smtpURL, err := mail.ParseSMTPURL(fake.URL(mail.SMTPSchemeStartTLS))
	if err != nil {
		return fmt.Errorf("error parsing the fake's SMTP URL: %w", err)
	}
	res, err := r.drainPhase(ctx, d, &drainPhase{
		name:  rowDrainSMTP,
		mails: r.opts.Mails,
		configure: func(config *service.Config, opts *service.Opts) {
			config.Mailers = []string{service.MailerSMTP}
			config.SMTPURL = smtpURL
			config.SMTPMaxRPS = 0
			config.MailFrom = resendFrom
			opts.SMTPTLSConfig = fake.ClientTLSConfig()
		},
	})
	if err != nil {
		return err
	}
	row := res.row(rowDrainSMTP, r.opts.EmailWorkers, d.engine)
	row.addNote("MAILER=smtp (go-mail, STARTTLS and AUTH PLAIN, one connection per mail) into smtpfake on loopback, unpaced (SMTP_MAX_RPS=0)")
	if accepted := len(fake.Messages()); int64(accepted) != res.completed {
		row.addNote(fmt.Sprintf("the fake accepted %d mails for %d completed jobs", accepted, res.completed))
		row.Errors++
	}
	r.report.Rows = append(r.report.Rows, row)
	r.report.compare(row, rowDrainNoop, targetDrainSMTP)
	return nil
}

// drainBudget drains under a budget: the fake answers 429 beyond -budget requests per second and
// the service paces itself at RESEND_MAX_RPS = -budget.
func (r *runner) drainBudget(ctx context.Context, d *database) error {
	budget := r.opts.Budget
	fake := resendfake.New(nil, &resendfake.Config{RatePerSecond: budget})
	defer fake.Close()
	sender, err := mail.NewResendSender(&mail.ResendConfig{APIKey: resendAPIKey, From: resendFrom, BaseURL: fake.URL()})
	if err != nil {
		return fmt.Errorf("error creating Resend sender: %w", err)
	}
	// About -duration's worth of mail at the budget (at least 4, so that there is a rate).
	mails := min(r.opts.Mails, max(int(float64(budget)*r.opts.Duration.Seconds()), 4))
	res, err := r.drainPhase(ctx, d, &drainPhase{name: rowDrainBudget, sender: sender, mails: mails, maxRPS: float64(budget)})
	if err != nil {
		return err
	}

	row := res.row(rowDrainBudget, r.opts.EmailWorkers, d.engine)
	// The delivered rate is the fake's: deliveries over the time between the first and the last.
	deliveries := fake.Deliveries()
	if n := len(deliveries); n >= 2 {
		span := deliveries[n-1].ReceivedAt.Sub(deliveries[0].ReceivedAt)
		if span > 0 {
			row.Rate = round(float64(n-1)/span.Seconds(), 1)
		}
	}
	tooMany, requests := 0, fake.Requests()
	for _, req := range requests {
		if req.Status == 429 {
			tooMany++
		}
	}
	row.Baseline = fmt.Sprintf("budget %d/s", budget)
	target := targetDrainBudget
	row.Target = &target
	row.setRatio(row.Rate/float64(budget), target)
	row.addNote(fmt.Sprintf("fake allows %d req/s (429 beyond), RESEND_MAX_RPS=%d; req/s = deliveries at the fake over first→last; %d answers were 429, %d snoozes",
		budget, budget, tooMany, res.snoozed))
	r.report.Rows = append(r.report.Rows, row)

	r.report.Checks = append(r.report.Checks, Check{
		Name:   "email-drain/budget gets no 429",
		Value:  fmt.Sprintf("%d of the fake's %d answers were 429", tooMany, len(requests)),
		Target: "none: RESEND_MAX_RPS paces the sends under the provider's limit",
		Pass:   tooMany == 0,
	}, Check{
		Name:   "email-drain/budget loses no mail",
		Value:  fmt.Sprintf("%d of %d completed, %d discarded, %d cancelled, %d failed attempts", res.completed, mails, res.discarded, res.cancelled, res.retried),
		Target: "all completed, none discarded or cancelled",
		Pass:   res.completed == int64(mails) && res.discarded == 0 && res.cancelled == 0,
	})
	return nil
}

// drainPhase is one drain: mails verification jobs for as many new users, worked by a River
// client from jobs.NewRiverConfig with sender, or with the mailer configure sets up.
type drainPhase struct {
	name      string
	sender    mail.Sender
	configure func(config *service.Config, opts *service.Opts)
	mails     int
	maxRPS    float64
}

type drainResult struct {
	sample
	completed, cancelled, discarded, retried, snoozed int64
	timedOut                                          bool
}

func (d *drainResult) row(name string, workers int, engine string) *Row {
	d.requests = d.completed
	d.errors = d.cancelled + d.discarded + d.retried
	row := engineRow(name, "mail", workers, &d.sample, engine)
	row.addNote("p50/p99 are River's run time of one job")
	if d.timedOut {
		row.addNote(fmt.Sprintf("timed out with %d of %d jobs completed", d.completed, d.completed+d.errors))
	}
	return row
}

// drainPhase creates the users and inserts their jobs, then starts a River client with the real
// workers and times it until every job is completed (or cancelled or discarded), or a bound.
func (r *runner) drainPhase(ctx context.Context, d *database, phase *drainPhase) (*drainResult, error) {
	config := d.config()
	config.AppSecret = r.secret
	config.AppURL = appURL
	config.EmailWorkers = r.opts.EmailWorkers
	config.ResendMaxRPS = phase.maxRPS
	config.FetchCooldown = r.opts.FetchCooldown
	config.FetchPollInterval = r.opts.FetchPollInterval
	config.Rules = abuse.DefaultRules()
	opts := &service.Opts{
		Sender: phase.sender,
		RiverConfigFunc: func(riverConfig *river.Config) {
			riverConfig.PeriodicJobs = nil // no prune in the middle of a measurement
		},
	}
	if phase.configure != nil {
		phase.configure(config, opts)
	}
	// serve, not worker: the embedded default has no worker role; the API it also builds is idle.
	svc, err := service.New(ctx, config, r.logger, service.RoleServe, opts)
	if err != nil {
		return nil, fmt.Errorf("error building the worker: %w", err)
	}
	defer svc.Close()
	store := svc.Store
	client := store.Jobs()

	jobIDs, err := r.insertDrainJobs(ctx, store, phase)
	if err != nil {
		return nil, err
	}

	events, unsubscribe := client.SubscribeConfig(&river.SubscribeConfig{
		ChanSize: 2*len(jobIDs) + 1000,
		Kinds: []river.EventKind{
			river.EventKindJobCancelled, river.EventKindJobCompleted, river.EventKindJobFailed, river.EventKindJobSnoozed,
		},
	})
	defer unsubscribe()

	// A bound on the phase: generous for the rate (10 mails/s unpaced, half the budget paced).
	expected := float64(len(jobIDs)) / 10
	if phase.maxRPS > 0 {
		expected = 2 * float64(len(jobIDs)) / phase.maxRPS
	}
	timeout := time.NewTimer(30*time.Second + time.Duration(expected*float64(time.Second)))
	defer timeout.Stop()

	res := &drainResult{}
	var completed atomic.Int64
	stopProgress := r.progress(phase.name, func(elapsed time.Duration) string {
		n := completed.Load()
		return fmt.Sprintf("%d/%d mails %6.0f mails/s", n, len(jobIDs), float64(n)/elapsed.Seconds())
	})
	r.warnings.mute(false)
	cpuStart := takeCPU()
	start := time.Now()
	if err := client.Start(ctx); err != nil {
		stopProgress()
		return nil, fmt.Errorf("error starting River: %w", err)
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
		defer cancel()
		_ = client.StopAndCancel(stopCtx)
	}()

	last := start
	failed := make(map[int64]bool)
	for res.completed+res.cancelled+res.discarded+int64(len(failed)) < int64(len(jobIDs)) && !res.timedOut {
		select {
		case <-ctx.Done():
			stopProgress()
			return nil, ctx.Err()
		case <-timeout.C:
			res.timedOut = true
		case event := <-events:
			if event.Job == nil || !jobIDs[event.Job.ID] {
				continue
			}
			switch event.Kind {
			case river.EventKindJobCompleted:
				res.completed++
				completed.Store(res.completed)
				last = time.Now()
				if event.JobStats != nil {
					res.hist.record(event.JobStats.RunDuration)
				}
				delete(failed, event.Job.ID)
			case river.EventKindJobCancelled:
				res.cancelled++
			case river.EventKindJobSnoozed:
				res.snoozed++
			case river.EventKindJobFailed:
				if event.Job.State == rivertype.JobStateDiscarded {
					res.discarded++
					delete(failed, event.Job.ID)
				} else {
					// Retried a minute or more later (RetryPolicy): not waited for.
					res.retried++
					failed[event.Job.ID] = true
				}
			}
		}
	}
	res.cpu = takeCPU().since(cpuStart)
	res.elapsed = last.Sub(start)
	if res.completed == 0 {
		res.elapsed = time.Since(start)
	}
	stopProgress()
	return res, nil
}

// insertDrainJobs creates phase.mails users directly through the store and inserts one
// verification job for each, before any worker starts. It returns the jobs' ids.
func (r *runner) insertDrainJobs(ctx context.Context, store riverstore.Store, phase *drainPhase) (map[int64]bool, error) {
	var (
		mu       sync.Mutex
		ids      = make(map[int64]bool, phase.mails)
		next     atomic.Int64
		firstErr error
		errOnce  sync.Once
		wg       sync.WaitGroup
	)
	stop := r.progress(phase.name+"/insert", func(time.Duration) string {
		return fmt.Sprintf("%d/%d users and jobs", min(next.Load(), int64(phase.mails)), phase.mails)
	})
	for range min(r.opts.Concurrency, 8) {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := next.Add(1) - 1
				if i >= int64(phase.mails) {
					return
				}
				user, err := store.UserInsert(ctx, &db.UserInsertParams{
					Email:        "drain-" + r.tag + "-" + phase.name[len("email-drain/"):] + "-" + strconv.FormatInt(i, 10) + "@example.com",
					Name:         "Load Test",
					PasswordHash: drainUserHash,
					Now:          time.Now(),
				})
				if err == nil {
					var res *rivertype.JobInsertResult
					res, err = store.JobInsert(ctx, jobs.VerificationEmailArgs{UserID: user.ID}, nil)
					if err == nil && res.UniqueSkippedAsDuplicate {
						err = fmt.Errorf("verification job of new user %d skipped as a duplicate", user.ID)
					}
					if err == nil {
						mu.Lock()
						ids[res.Job.ID] = true
						mu.Unlock()
					}
				}
				if err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
			}
		})
	}
	wg.Wait()
	stop()
	if firstErr != nil {
		return nil, fmt.Errorf("error inserting users and jobs: %w", firstErr)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return ids, nil
}
