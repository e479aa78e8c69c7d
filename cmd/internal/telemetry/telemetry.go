// Package telemetry owns a postguard process's tracing: the OpenTelemetry tracer provider,
// built from OpenTelemetry's standard OTEL_ variables through autoexport, W3C trace-context
// propagation, the flush at shutdown, and the instrumentation each part of the service is handed
// (cmd/internal/service passes them along its construction line; nothing is global).
//
// Tracing is off unless an OTEL_ variable asks for it: OTEL_TRACES_EXPORTER names an exporter
// (otlp or console), or OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_EXPORTER_OTLP_TRACES_ENDPOINT names a
// collector (OTLP, the specification's default exporter). Off, New builds nothing, and every
// method that hands out instrumentation returns nil: no middleware, tracer, transport or
// wrapper is installed anywhere, so the hot paths are exactly what they are without this
// package.
package telemetry

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strconv"
	"strings"

	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// DefaultServiceName is the service.name of postguard's spans when neither OTEL_SERVICE_NAME nor
// OTEL_RESOURCE_ATTRIBUTES names one.
const DefaultServiceName = "postguard"

// The exporters OTEL_TRACES_EXPORTER may name.
const (
	ExporterOTLP    = "otlp"
	ExporterConsole = "console"
	ExporterNone    = "none"
)

// Opts are what a caller may give New beyond the environment. A nil *Opts is fine.
type Opts struct {
	// Exporter, when set, receives every span as it ends (synchronously), in place of the
	// exporter the environment names, and tracing is on whatever the environment says: tests
	// give tracetest's in-memory exporter.
	Exporter sdktrace.SpanExporter

	// Getenv reads the variables; os.Getenv when nil. The exporters autoexport builds read the
	// OTEL_EXPORTER_OTLP_ variables from the process's environment themselves, so a Getenv other
	// than the process's own serves tests of the checks only.
	Getenv func(string) string

	// Logger receives OpenTelemetry's own errors (an export that failed) when tracing is on;
	// slog.Default() when nil.
	Logger *slog.Logger
}

// Telemetry is a process's tracing: on (a tracer provider) or off (nothing). The zero value, and
// a nil *Telemetry, are off.
type Telemetry struct {
	provider *sdktrace.TracerProvider
	exporter string
}

// Settings are what the OTEL_ variables say, checked.
type Settings struct {
	// Exporter is the exporter OTEL_TRACES_EXPORTER names (ExporterOTLP when it is unset and an
	// OTLP endpoint is), or "" when tracing is off.
	Exporter string
	// Sampler is OTEL_TRACES_SAMPLER's sampler with OTEL_TRACES_SAMPLER_ARG; nil leaves the
	// SDK's default (parentbased_always_on).
	Sampler sdktrace.Sampler
}

// ParseEnv reads and checks the OTEL_ variables postguard acts on, naming each bad one in the
// error: OTEL_SDK_DISABLED, OTEL_TRACES_EXPORTER, OTEL_EXPORTER_OTLP_PROTOCOL and
// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, OTEL_EXPORTER_OTLP_ENDPOINT and
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG. The rest
// (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, OTEL_EXPORTER_OTLP_HEADERS, OTEL_BSP_…) are
// OpenTelemetry's to read.
func ParseEnv(getenv func(string) string) (*Settings, error) {
	get := func(name string) string { return strings.TrimSpace(getenv(name)) }
	var errs []error
	bad := func(name, format string, args ...any) {
		errs = append(errs, fmt.Errorf("invalid %s: %s", name, fmt.Sprintf(format, args...)))
	}

	settings := &Settings{}
	switch exporter := get("OTEL_TRACES_EXPORTER"); exporter {
	case ExporterOTLP, ExporterConsole:
		settings.Exporter = exporter
	case ExporterNone:
	case "":
		if get("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" {
			settings.Exporter = ExporterOTLP
		}
	default:
		bad("OTEL_TRACES_EXPORTER", "%q is not an exporter postguard has: use otlp, console or none", exporter)
	}
	switch disabled := strings.ToLower(get("OTEL_SDK_DISABLED")); disabled {
	case "", "false":
	case "true":
		settings.Exporter = ""
	default:
		bad("OTEL_SDK_DISABLED", "%q is neither true nor false", disabled)
	}

	for _, name := range []string{"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"} {
		if protocol := get(name); protocol != "" && protocol != "grpc" && protocol != "http/protobuf" {
			bad(name, "%q is not a protocol of the OTLP exporter: use http/protobuf (the default) or grpc", protocol)
		}
	}
	for _, name := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"} {
		if endpoint := get(name); endpoint != "" {
			if u, err := url.Parse(endpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				bad(name, "not an http:// or https:// URL of a collector (e.g. http://localhost:4318)")
			}
		}
	}

	sampler, err := parseSampler(get("OTEL_TRACES_SAMPLER"), get("OTEL_TRACES_SAMPLER_ARG"))
	if err != nil {
		errs = append(errs, err)
	}
	settings.Sampler = sampler

	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return settings, nil
}

// parseSampler is the sampler the specification's OTEL_TRACES_SAMPLER names, with
// OTEL_TRACES_SAMPLER_ARG's ratio for the ratio samplers (1 when unset); nil for "".
func parseSampler(name, arg string) (sdktrace.Sampler, error) {
	name = strings.ToLower(name)
	ratio := 1.0
	if arg != "" && (name == "traceidratio" || name == "parentbased_traceidratio") {
		var err error
		if ratio, err = strconv.ParseFloat(arg, 64); err != nil || ratio < 0 || ratio > 1 {
			return nil, fmt.Errorf("invalid OTEL_TRACES_SAMPLER_ARG: %q is not a ratio from 0 to 1", arg)
		}
	}
	switch name {
	case "":
		return nil, nil
	case "always_on":
		return sdktrace.AlwaysSample(), nil
	case "always_off":
		return sdktrace.NeverSample(), nil
	case "traceidratio":
		return sdktrace.TraceIDRatioBased(ratio), nil
	case "parentbased_always_on":
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), nil
	case "parentbased_traceidratio":
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio)), nil
	}
	return nil, fmt.Errorf("invalid OTEL_TRACES_SAMPLER: %q is not a sampler: use always_on, always_off, traceidratio, parentbased_always_on (the default), parentbased_always_off or parentbased_traceidratio", name)
}

// New builds the process's tracing from the environment (ParseEnv): off when no OTEL_ variable
// turns it on, else a tracer provider whose spans go to the exporter OTEL_TRACES_EXPORTER names
// (autoexport's: OTLP over http/protobuf or gRPC as OTEL_EXPORTER_OTLP_ variables say, or
// console, JSON on standard output), in batches, sampled as OTEL_TRACES_SAMPLER says, on a
// resource of service.name postguard (OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES prevail)
// and nothing else of the host. Shutdown flushes it.
func New(ctx context.Context, opts *Opts) (*Telemetry, error) {
	if opts == nil {
		opts = &Opts{}
	}
	getenv := opts.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	settings, err := ParseEnv(getenv)
	if err != nil {
		return nil, err
	}

	var processor sdktrace.TracerProviderOption
	switch {
	case opts.Exporter != nil:
		processor = sdktrace.WithSyncer(opts.Exporter)
		settings.Exporter = "custom"
	case settings.Exporter == "":
		return &Telemetry{}, nil
	default:
		exporter, err := autoexport.NewSpanExporter(ctx)
		if err != nil {
			return nil, fmt.Errorf("OTEL_TRACES_EXPORTER=%s: %w", settings.Exporter, err)
		}
		processor = sdktrace.WithBatcher(exporter)
	}

	// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES come after the default, so they prevail. No
	// detector of the host or the process is added: its name, its command line and its user are
	// nobody's business in a trace.
	res, err := resource.New(ctx,
		resource.WithTelemetrySDK(),
		resource.WithAttributes(semconv.ServiceName(DefaultServiceName)),
		resource.WithFromEnv(),
	)
	if err != nil {
		return nil, fmt.Errorf("invalid OTEL_RESOURCE_ATTRIBUTES or OTEL_SERVICE_NAME: %w", err)
	}

	providerOpts := []sdktrace.TracerProviderOption{processor, sdktrace.WithResource(res)}
	if settings.Sampler != nil {
		providerOpts = append(providerOpts, sdktrace.WithSampler(settings.Sampler))
	}
	logger := cmp.Or(opts.Logger, slog.Default())
	// OpenTelemetry reports what fails in the background (an export the collector refused) to
	// its process-wide error handler, which would print it to standard error in a format of its
	// own; the process's log says it instead.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		logger.Warn("OpenTelemetry", slog.String("error", err.Error()))
	}))
	return &Telemetry{provider: sdktrace.NewTracerProvider(providerOpts...), exporter: settings.Exporter}, nil
}

// Enabled says tracing is on.
func (t *Telemetry) Enabled() bool { return t != nil && t.provider != nil }

// Exporter names the exporter spans go to (otlp, console, custom), "" when tracing is off: for
// the start line.
func (t *Telemetry) Exporter() string {
	if !t.Enabled() {
		return ""
	}
	return t.exporter
}

// TracerProvider is the tracer provider; nil when tracing is off.
func (t *Telemetry) TracerProvider() trace.TracerProvider {
	if !t.Enabled() {
		return nil
	}
	return t.provider
}

// Shutdown exports the spans still buffered and stops the provider, within ctx; nothing when
// tracing is off. Call it once the process has stopped serving and working, so that the last
// requests' and jobs' spans are in.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	if !t.Enabled() {
		return nil
	}
	if err := t.provider.Shutdown(ctx); err != nil {
		return fmt.Errorf("error flushing traces: %w", err)
	}
	return nil
}
