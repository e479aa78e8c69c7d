package main

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMeasure_LimiterOnly measures examples/limiteronly as a new host module would build it
// (hostcost's own run, without the binaries): what the issue of a library carrying only what it
// uses asked for, kept true.
func TestMeasure_LimiterOnly(t *testing.T) {
	t.Parallel()

	report, err := Measure(t.Context(), &Opts{App: "../../examples/limiteronly", Postguard: "../.."})
	require.NoError(t, err)
	require.Empty(t, report.Problems(), "%+v", report)
	require.Empty(t, report.Forbidden)
	require.Empty(t, report.Tools)
	require.Empty(t, report.Upgrades)
	require.LessOrEqual(t, report.ExtraModules(), MaxExtraModules)

	// The measurement sees what it should: the postguard variant links postguard's limiter, the
	// baseline links none of postguard.
	require.Contains(t, report.With.NonStdPackages, "github.com/postguard/postguard/api/abuse/ginlimit")
	for _, pkg := range report.Baseline.NonStdPackages {
		require.False(t, strings.HasPrefix(pkg, postguardModule), pkg)
	}
	require.Greater(t, report.With.NonStd, report.Baseline.NonStd)
}

// TestLimiterOnly_Links is the regression guard within this module, with no module proxy: the
// example links no package of River, River UI, pgx or Prometheus.
func TestLimiterOnly_Links(t *testing.T) {
	t.Parallel()

	out, err := exec.CommandContext(t.Context(), "go", "list", "-deps", "../../examples/limiteronly").Output()
	require.NoError(t, err)
	require.Contains(t, string(out), "github.com/postguard/postguard/api/abuse/ginlimit")
	for pkg := range strings.Lines(string(out)) {
		for _, prefix := range forbiddenPrefixes {
			require.False(t, strings.HasPrefix(pkg, prefix), "examples/limiteronly links %s", strings.TrimSpace(pkg))
		}
	}
}
