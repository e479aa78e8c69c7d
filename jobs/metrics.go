package jobs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
)

// queueDepthLimit bounds the count of each state at scrape time: the collector lists at most
// this many job ids per state, so a deep backlog reads as queueDepthLimit (enough to alert on)
// and a scrape never walks the whole table.
const queueDepthLimit = 1000

// queueDepthStates are the states counted by the queue depth gauge: the work still ahead.
// Finished jobs are left out: there are many, and prune removes them.
var queueDepthStates = []rivertype.JobState{ //nolint:gochecknoglobals // a constant list
	rivertype.JobStateAvailable,
	rivertype.JobStatePending,
	rivertype.JobStateRetryable,
	rivertype.JobStateRunning,
	rivertype.JobStateScheduled,
}

// metrics are the counters the email workers update. A nil *metrics counts nothing.
type metrics struct {
	deliveries *prometheus.CounterVec
}

func newMetrics(registerer prometheus.Registerer) (*metrics, error) {
	if registerer == nil {
		return nil, nil //nolint:nilnil // no registerer, no metrics: a nil *metrics is valid
	}
	deliveries := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "postguard_email_deliveries_total",
		Help: "Email delivery attempts by job kind and outcome (sent, retried, snoozed, cancelled, discarded, skipped, suppressed).",
	}, []string{"kind", "outcome"})
	if err := registerer.Register(deliveries); err != nil {
		var already prometheus.AlreadyRegisteredError
		if !errors.As(err, &already) {
			return nil, fmt.Errorf("error registering email delivery metrics: %w", err)
		}
		existing, ok := already.ExistingCollector.(*prometheus.CounterVec)
		if !ok {
			return nil, fmt.Errorf("error registering email delivery metrics: %w", err)
		}
		deliveries = existing
	}
	return &metrics{deliveries: deliveries}, nil
}

func (m *metrics) delivery(kind, outcome string) {
	if m == nil {
		return
	}
	m.deliveries.WithLabelValues(kind, outcome).Inc()
}

// queueDepthCollector reports postguard_jobs{state} at scrape time, through River's public
// JobList (engine-agnostic, no SQL on River's tables), counting up to queueDepthLimit per state.
type queueDepthCollector struct {
	desc    *prometheus.Desc
	logger  *slog.Logger
	jobs    RiverClient
	timeout time.Duration
}

func newQueueDepthCollector(jobs RiverClient, logger *slog.Logger) *queueDepthCollector {
	return &queueDepthCollector{
		desc: prometheus.NewDesc(
			"postguard_jobs",
			fmt.Sprintf("Jobs in River's queue by state (available, pending, retryable, running, scheduled); saturates at %d.", queueDepthLimit),
			[]string{"state"}, nil,
		),
		logger:  logger,
		jobs:    jobs,
		timeout: 5 * time.Second,
	}
}

// Describe implements prometheus.Collector.
func (c *queueDepthCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector. A state whose count fails is left out of the scrape
// (and logged) rather than reported as zero.
func (c *queueDepthCollector) Collect(ch chan<- prometheus.Metric) {
	client := c.jobs
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()

	for _, state := range queueDepthStates {
		res, err := client.JobList(ctx, river.NewJobListParams().States(state).First(queueDepthLimit))
		if err != nil {
			c.logger.WarnContext(ctx, "error counting jobs for metrics", slog.String("state", string(state)), slog.String("error", err.Error()))
			continue
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(len(res.Jobs)), string(state))
	}
}
