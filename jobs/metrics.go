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

// ProviderNone is the provider label of a delivery attempt that reached no provider (the user was
// deleted, the address is suppressed, the database failed first).
const ProviderNone = "none"

// metrics are the counters the email workers update. A nil *metrics counts nothing.
type metrics struct {
	deliveries  *prometheus.CounterVec
	failovers   *prometheus.CounterVec
	circuitOpen *prometheus.GaugeVec
}

func newMetrics(registerer prometheus.Registerer) (*metrics, error) {
	if registerer == nil {
		return nil, nil //nolint:nilnil // no registerer, no metrics: a nil *metrics is valid
	}
	deliveries, err := register(registerer, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "postguard_email_deliveries_total",
		Help: "Email delivery attempts by job kind, the provider the attempt ended at (none when it reached none) and outcome (sent, retried, snoozed, cancelled, discarded, skipped, suppressed).",
	}, []string{"kind", "provider", "outcome"}))
	if err != nil {
		return nil, err
	}
	failovers, err := register(registerer, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "postguard_email_failovers_total",
		Help: "Delivery attempts that went on to the next provider after an outage of one (from) to the next (to).",
	}, []string{"from", "to"}))
	if err != nil {
		return nil, err
	}
	circuitOpen, err := register(registerer, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "postguard_email_circuit_open",
		Help: "1 while a provider's circuit is open in this process (from an outage until the provider next takes a mail or refuses one), else 0.",
	}, []string{"provider"}))
	if err != nil {
		return nil, err
	}
	return &metrics{deliveries: deliveries, failovers: failovers, circuitOpen: circuitOpen}, nil
}

// register registers collector, or returns the one registered under its name before (the
// workers of one registry, built twice, share their counters).
func register[C prometheus.Collector](registerer prometheus.Registerer, collector C) (C, error) {
	err := registerer.Register(collector)
	if err == nil {
		return collector, nil
	}
	if already, ok := errors.AsType[prometheus.AlreadyRegisteredError](err); ok {
		if existing, ok := already.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	var zero C
	return zero, fmt.Errorf("error registering email delivery metrics: %w", err)
}

func (m *metrics) delivery(kind, provider, outcome string) {
	if m == nil {
		return
	}
	m.deliveries.WithLabelValues(kind, provider, outcome).Inc()
}

func (m *metrics) failover(from, to string) {
	if m == nil {
		return
	}
	m.failovers.WithLabelValues(from, to).Inc()
}

// circuit sets a provider's circuit gauge.
func (m *metrics) circuit(provider string, open bool) {
	if m == nil {
		return
	}
	value := 0.0
	if open {
		value = 1
	}
	m.circuitOpen.WithLabelValues(provider).Set(value)
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
