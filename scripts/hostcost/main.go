// Command hostcost measures what postguard costs a host app that uses part of it: it copies an
// example app (examples/limiteronly by default) into two fresh modules in a temporary directory,
// one requiring postguard through a replace of this checkout and one without postguard (the
// app's baseline variant: its files built with the "baseline" tag instead of those built
// without it), runs `go mod tidy` in each, and reports side by side the packages each links,
// its modules, its module graph and its binary, and what adding postguard changed: the packages
// of River, River UI, pgx, Prometheus or goose it links beyond the baseline's, the tools' modules
// (golangci-lint, sqlc, pg_query_go, go-redis) anywhere in its module graph, every module the
// baseline requires whose version it upgraded, and the versions it raised elsewhere in the
// module graph (of modules the app does not build with).
//
//	go run ./scripts/hostcost                        # examples/limiteronly against this checkout
//	go run ./scripts/hostcost -app examples/hostapp  # any app with a baseline variant
//
// The baseline requires the modules the app imports at the versions the postguard variant
// resolved, as a host that already uses them would. `go mod tidy` needs the modules in the
// module cache or the module proxy.
package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"go/build/constraint"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// postguardModule is the module path the host requires.
const postguardModule = "github.com/postguard/postguard"

// baselineTag selects an app's files without postguard; its files built without the tag are the
// ones that use postguard.
const baselineTag = "baseline"

// hostGoLine is the go line both variants start from: the least the baseline's own
// dependencies allow (modernc.org/sqlite's). `go mod tidy` raises it when a dependency needs more.
const hostGoLine = "1.26.0"

// forbiddenPrefixes are the packages a host that uses only the limiter must not link because
// of postguard: a job queue, its UI, a PostgreSQL driver on SQLite, metrics nobody asked for.
var forbiddenPrefixes = []string{ //nolint:gochecknoglobals // a constant table
	"github.com/riverqueue/",
	"riverqueue.com/",
	"github.com/jackc/",
	"github.com/prometheus/",
}

// toolModules are postguard's tools', which belong in no host's module graph.
var toolModules = []string{ //nolint:gochecknoglobals // a constant table
	"github.com/golangci/golangci-lint",
	"github.com/sqlc-dev/sqlc",
	"github.com/pganalyze/pg_query_go",
	"github.com/wasilibs/go-pgquery",
	"github.com/redis/go-redis",
	"github.com/go-redis/redis_rate",
}

func main() {
	app := flag.String("app", "examples/limiteronly", "the app to measure: a main package with a baseline variant (see the package doc)")
	postguard := flag.String("postguard", ".", "the postguard checkout the app requires through a replace")
	sizes := flag.Bool("sizes", true, "build both binaries and report their sizes")
	keep := flag.Bool("keep", false, "keep the temporary modules and print where they are")
	flag.Parse()

	report, err := Measure(context.Background(), &Opts{App: *app, Postguard: *postguard, Sizes: *sizes, Keep: *keep})
	if err != nil {
		fmt.Fprintln(os.Stderr, "hostcost:", err)
		os.Exit(1)
	}
	report.Print(os.Stdout)
	if problems := report.Problems(); len(problems) > 0 {
		fmt.Fprintln(os.Stdout)
		for _, problem := range problems {
			fmt.Fprintln(os.Stdout, "FAIL:", problem)
		}
		os.Exit(1)
	}
}

// Opts are Measure's.
type Opts struct {
	// App is the app's directory; Postguard the checkout it requires.
	App, Postguard string
	// Sizes builds both binaries for their sizes.
	Sizes bool
	// Keep leaves the temporary modules behind (Report.Dir).
	Keep bool
}

// MaxExtraModules is the most modules `go list -m all` may list beyond the baseline's.
const MaxExtraModules = 40

// Variant is what one of the two modules links and requires.
type Variant struct {
	Packages, NonStd int      // `go list -deps`: every package, and those not in the standard library
	NonStdPackages   []string // the non-standard ones
	Modules          []Module // `go list -m all`, the main module excepted
	GraphLines       int      // `go mod graph`
	GraphModules     []string // every module path in `go mod graph`
	GoLine           string   // the go line after `go mod tidy`
	Requires         []string // the module paths its go.mod requires (direct and indirect)
	BinaryBytes      int64    // 0 when not built
}

// Module is one line of `go list -m all`.
type Module struct {
	Path, Version string
}

// Report compares the app with postguard to its baseline.
type Report struct {
	App       string
	Dir       string // the temporary modules, when kept
	With      *Variant
	Baseline  *Variant
	Forbidden []string // packages of forbiddenPrefixes (or goose's) that only the postguard variant links
	Tools     []string // tool modules in the postguard variant's module graph
	// Upgrades are the modules the baseline's go.mod requires (what the app builds with) whose
	// version the postguard variant upgraded, and its go line: "path old => new".
	Upgrades []string
	// GraphRaises are the other modules of the baseline's module graph whose version the
	// postguard variant raised: versions of modules the app does not build with, which it would
	// get only on importing them.
	GraphRaises []string
}

// Measure builds both variants of opts.App and compares them.
func Measure(ctx context.Context, opts *Opts) (_ *Report, err error) {
	app, err := filepath.Abs(opts.App)
	if err != nil {
		return nil, err
	}
	postguard, err := filepath.Abs(opts.Postguard)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "hostcost-")
	if err != nil {
		return nil, err
	}
	report := &Report{App: opts.App}
	if opts.Keep {
		report.Dir = dir
	} else {
		defer os.RemoveAll(dir)
	}

	withDir, baseDir := filepath.Join(dir, "with"), filepath.Join(dir, "baseline")
	if err := copyApp(app, withDir, false); err != nil {
		return nil, err
	}
	if err := copyApp(app, baseDir, true); err != nil {
		return nil, err
	}

	// The app with postguard: its imports resolved by `go mod tidy` against postguard's own
	// requirements.
	if err := writeGoMod(withDir, fmt.Sprintf("module example.com/host\n\ngo %s\n\nrequire %s v0.0.0\n\nreplace %s => %s\n",
		hostGoLine, postguardModule, postguardModule, postguard)); err != nil {
		return nil, err
	}
	if _, err := goCmd(ctx, withDir, "mod", "tidy"); err != nil {
		return nil, err
	}
	// The baseline requires what the app requires directly, at the versions just resolved: a
	// host that has these modules already, before it adds postguard.
	direct, err := directRequirements(ctx, withDir)
	if err != nil {
		return nil, err
	}
	var requires strings.Builder
	for _, m := range direct {
		if m.Path != postguardModule {
			fmt.Fprintf(&requires, "require %s %s\n", m.Path, m.Version)
		}
	}
	if err := writeGoMod(baseDir, fmt.Sprintf("module example.com/host\n\ngo %s\n\n%s", hostGoLine, requires.String())); err != nil {
		return nil, err
	}
	if _, err := goCmd(ctx, baseDir, "mod", "tidy"); err != nil {
		return nil, err
	}

	if report.With, err = measure(ctx, withDir, nil, opts.Sizes); err != nil {
		return nil, err
	}
	if report.Baseline, err = measure(ctx, baseDir, []string{"-tags", baselineTag}, opts.Sizes); err != nil {
		return nil, err
	}
	report.compare()
	return report, nil
}

// copyApp copies app's files into dst: its non-test Go files of the variant (baseline or the
// postguard one) and everything else but its tests' data, which the app may embed.
func copyApp(app, dst string, baseline bool) error {
	return filepath.WalkDir(app, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(app, path)
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == "testdata" {
				return filepath.SkipDir
			}
			return os.MkdirAll(filepath.Join(dst, rel), 0o750)
		}
		if strings.HasSuffix(path, "_test.go") {
			return nil
		}
		data, err := os.ReadFile(path) //nolint:gosec // G304: the app's own files, walked from the directory the caller named
		if err != nil {
			return err
		}
		if strings.HasSuffix(path, ".go") {
			keep, err := inVariant(data, baseline)
			if err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			if !keep {
				return nil
			}
		}
		return os.WriteFile(filepath.Join(dst, rel), data, 0o600) //nolint:gosec // G703: rel is a path under the app's directory, from WalkDir
	})
}

// inVariant says whether a Go file with source src is built in the variant.
func inVariant(src []byte, baseline bool) (bool, error) {
	for line := range strings.Lines(string(src)) {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "package ") {
			break
		}
		if !constraint.IsGoBuild(line) {
			continue
		}
		expr, err := constraint.Parse(line)
		if err != nil {
			return false, err
		}
		return expr.Eval(func(tag string) bool { return tag == baselineTag && baseline }), nil
	}
	return true, nil
}

func writeGoMod(dir, content string) error {
	return os.WriteFile(filepath.Join(dir, "go.mod"), []byte(content), 0o600)
}

// directRequirements are the requirements of dir's go.mod that are not marked indirect.
func directRequirements(ctx context.Context, dir string) ([]Module, error) {
	out, err := goCmd(ctx, dir, "mod", "edit", "-json")
	if err != nil {
		return nil, err
	}
	var goMod struct {
		Require []struct {
			Path, Version string
			Indirect      bool
		}
	}
	if err := json.Unmarshal(out, &goMod); err != nil {
		return nil, fmt.Errorf("error reading go.mod: %w", err)
	}
	var direct []Module
	for _, r := range goMod.Require {
		if !r.Indirect {
			direct = append(direct, Module{Path: r.Path, Version: r.Version})
		}
	}
	return direct, nil
}

// measure is what the module in dir links and requires.
func measure(ctx context.Context, dir string, buildFlags []string, sizes bool) (*Variant, error) {
	v := &Variant{}
	out, err := goCmd(ctx, dir, append(append([]string{"list", "-deps"}, buildFlags...), "-f", "{{if not .Standard}}+{{end}}{{.ImportPath}}", ".")...)
	if err != nil {
		return nil, err
	}
	for line := range strings.Lines(string(out)) {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		v.Packages++
		if pkg, ok := strings.CutPrefix(line, "+"); ok && pkg != "example.com/host" {
			v.NonStd++
			v.NonStdPackages = append(v.NonStdPackages, pkg)
		}
	}

	if out, err = goCmd(ctx, dir, "list", "-m", "-f", "{{if not .Main}}{{.Path}} {{.Version}}{{end}}", "all"); err != nil {
		return nil, err
	}
	for line := range strings.Lines(string(out)) {
		if path, version, ok := strings.Cut(strings.TrimSpace(line), " "); ok {
			v.Modules = append(v.Modules, Module{Path: path, Version: version})
		}
	}

	if out, err = goCmd(ctx, dir, "mod", "graph"); err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for line := range strings.Lines(string(out)) {
		fields := strings.Fields(line)
		if len(fields) != 2 {
			continue
		}
		v.GraphLines++
		for _, f := range fields {
			path, _, _ := strings.Cut(f, "@")
			if !seen[path] {
				seen[path] = true
				v.GraphModules = append(v.GraphModules, path)
			}
		}
	}

	if out, err = goCmd(ctx, dir, "mod", "edit", "-json"); err != nil {
		return nil, err
	}
	var goMod struct {
		Go      string
		Require []struct{ Path string }
	}
	if err := json.Unmarshal(out, &goMod); err != nil {
		return nil, fmt.Errorf("error reading go.mod: %w", err)
	}
	v.GoLine = goMod.Go
	for _, r := range goMod.Require {
		v.Requires = append(v.Requires, r.Path)
	}

	if sizes {
		binary := filepath.Join(dir, "app.bin")
		if _, err := goCmd(ctx, dir, append(append([]string{"build", "-trimpath", "-o", binary}, buildFlags...), ".")...); err != nil {
			return nil, err
		}
		info, err := os.Stat(binary)
		if err != nil {
			return nil, err
		}
		v.BinaryBytes = info.Size()
	}
	return v, nil
}

// compare fills what adding postguard changed.
func (r *Report) compare() {
	baselinePackages := map[string]bool{}
	for _, pkg := range r.Baseline.NonStdPackages {
		baselinePackages[pkg] = true
	}
	for _, pkg := range r.With.NonStdPackages {
		if baselinePackages[pkg] {
			continue
		}
		if strings.HasPrefix(pkg, "github.com/pressly/goose/") || slices.ContainsFunc(forbiddenPrefixes, func(prefix string) bool { return strings.HasPrefix(pkg, prefix) }) {
			r.Forbidden = append(r.Forbidden, pkg)
		}
	}
	for _, path := range r.With.GraphModules {
		if slices.ContainsFunc(toolModules, func(tool string) bool { return strings.HasPrefix(path, tool) }) {
			r.Tools = append(r.Tools, path)
		}
	}
	with := map[string]string{}
	for _, m := range r.With.Modules {
		with[m.Path] = m.Version
	}
	for _, m := range r.Baseline.Modules {
		// Minimal version selection only ever raises a version: any change is an upgrade.
		v, ok := with[m.Path]
		if !ok || v == m.Version {
			continue
		}
		change := fmt.Sprintf("%s %s => %s", m.Path, m.Version, v)
		if slices.Contains(r.Baseline.Requires, m.Path) {
			r.Upgrades = append(r.Upgrades, change)
		} else {
			r.GraphRaises = append(r.GraphRaises, change)
		}
	}
	if r.With.GoLine != r.Baseline.GoLine {
		r.Upgrades = append(r.Upgrades, fmt.Sprintf("go line %s => %s", r.Baseline.GoLine, r.With.GoLine))
	}
}

// ExtraModules is how many more modules `go list -m all` lists with postguard than without.
func (r *Report) ExtraModules() int { return len(r.With.Modules) - len(r.Baseline.Modules) }

// Problems are what a host must not pay for the limiter: each a sentence, none when all holds.
func (r *Report) Problems() []string {
	var problems []string
	if len(r.Forbidden) > 0 {
		problems = append(problems, fmt.Sprintf("links %d packages of River, River UI, pgx, Prometheus or goose beyond the baseline's: %s", len(r.Forbidden), strings.Join(r.Forbidden, " ")))
	}
	if n := r.ExtraModules(); n > MaxExtraModules {
		problems = append(problems, fmt.Sprintf("go list -m all lists %d modules more than the baseline, more than %d", n, MaxExtraModules))
	}
	if len(r.Tools) > 0 {
		problems = append(problems, "the module graph has postguard's tools: "+strings.Join(r.Tools, " "))
	}
	if len(r.Upgrades) > 0 {
		problems = append(problems, "upgrades modules the app requires: "+strings.Join(r.Upgrades, "; "))
	}
	return problems
}

// Print writes the report as a table.
func (r *Report) Print(w io.Writer) {
	fmt.Fprintf(w, "%s, with postguard and without (its baseline variant)\n\n", r.App)
	fmt.Fprintln(w, "| | with postguard | without | difference |")
	fmt.Fprintln(w, "| --- | --- | --- | --- |")
	row := func(name string, with, without int64, format func(int64) string) {
		fmt.Fprintf(w, "| %s | %s | %s | %+d |\n", name, format(with), format(without), with-without)
	}
	count := func(n int64) string { return fmt.Sprint(n) }
	row("`go list -deps` packages", int64(r.With.Packages), int64(r.Baseline.Packages), count)
	row("non-standard packages", int64(r.With.NonStd), int64(r.Baseline.NonStd), count)
	if r.With.BinaryBytes > 0 {
		mb := func(n int64) string { return fmt.Sprintf("%.1f MB", float64(n)/1e6) }
		fmt.Fprintf(w, "| binary | %s | %s | %+.1f MB |\n", mb(r.With.BinaryBytes), mb(r.Baseline.BinaryBytes), float64(r.With.BinaryBytes-r.Baseline.BinaryBytes)/1e6)
	}
	row("`go list -m all` modules", int64(len(r.With.Modules)), int64(len(r.Baseline.Modules)), count)
	row("`go mod graph` lines", int64(r.With.GraphLines), int64(r.Baseline.GraphLines), count)
	fmt.Fprintf(w, "| go line | %s | %s | |\n\n", r.With.GoLine, r.Baseline.GoLine)

	baseline := map[string]bool{}
	for _, m := range r.Baseline.Modules {
		baseline[m.Path] = true
	}
	var extra []string
	for _, m := range r.With.Modules {
		if !baseline[m.Path] {
			extra = append(extra, m.Path)
		}
	}
	fmt.Fprintf(w, "modules postguard adds (%d): %s\n", len(extra), strings.Join(extra, " "))
	basePkgs := map[string]bool{}
	for _, pkg := range r.Baseline.NonStdPackages {
		basePkgs[pkg] = true
	}
	var added []string
	for _, pkg := range r.With.NonStdPackages {
		if !basePkgs[pkg] {
			added = append(added, pkg)
		}
	}
	fmt.Fprintf(w, "packages postguard adds (%d): %s\n", len(added), strings.Join(added, " "))
	fmt.Fprintf(w, "River, River UI, pgx, Prometheus or goose packages beyond the baseline's: %s\n", cmp.Or(strings.Join(r.Forbidden, " "), "none"))
	fmt.Fprintf(w, "tools' modules in the module graph: %s\n", cmp.Or(strings.Join(r.Tools, " "), "none"))
	fmt.Fprintf(w, "modules the app requires, upgraded: %s\n", cmp.Or(strings.Join(r.Upgrades, "; "), "none"))
	fmt.Fprintf(w, "versions raised in the module graph only (not built into the app): %s\n", cmp.Or(strings.Join(r.GraphRaises, "; "), "none"))
	if r.Dir != "" {
		fmt.Fprintf(w, "modules kept in %s\n", r.Dir)
	}
}

// goCmd runs the go command in dir, outside any workspace and with the local toolchain, and
// returns its standard output.
func goCmd(ctx context.Context, dir string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, cmp.Or(os.Getenv("GO"), "go"), args...) //nolint:gosec // G204: the go command, with the arguments this tool builds
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod", "GOTOOLCHAIN=local")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) {
			return nil, fmt.Errorf("go %s in %s: %w\n%s", strings.Join(args, " "), dir, err, stderr.String())
		}
		return nil, fmt.Errorf("go %s: %w", strings.Join(args, " "), err)
	}
	return out, nil
}
