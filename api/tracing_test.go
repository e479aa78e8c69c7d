package api

import (
	"reflect"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace/noop"
)

// TestNew_Tracing is tracing off by construction: without a TracerProvider the router has no
// tracing middleware at all (nothing to skip per request), and with one it is the first.
func TestNew_Tracing(t *testing.T) {
	t.Parallel()

	middleware := func(t *testing.T, bundle *testBundle) []string {
		t.Helper()
		var names []string
		for _, handler := range bundle.router.Handlers {
			names = append(names, runtime.FuncForPC(reflect.ValueOf(handler).Pointer()).Name())
		}
		return names
	}
	traced := func(name string) bool { return strings.Contains(name, "traceRequest") }

	t.Run("Off", func(t *testing.T) {
		t.Parallel()

		names := middleware(t, newSQLiteBundle(t, nil))
		require.NotEmpty(t, names)
		for _, name := range names {
			require.False(t, traced(name), name)
		}
	})

	t.Run("On", func(t *testing.T) {
		t.Parallel()

		names := middleware(t, newSQLiteBundle(t, &setupOpts{configFunc: func(config *Config) {
			config.TracerProvider = noop.NewTracerProvider()
		}}))
		require.True(t, traced(names[0]), names)
	})
}
