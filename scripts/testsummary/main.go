// Command testsummary reads `go test -json` on stdin and prints what a person needs: each
// package's result, every failing test's output, every skipped test with its reason (so a run
// without PostgreSQL says plainly what it did not test), and a closing count. It exits non-zero
// when anything failed.
//
//	go test -json ./... | go run ./scripts/testsummary
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

type event struct {
	Action  string
	Package string
	Test    string
	Output  string
	Elapsed float64
}

func main() {
	failed, err := summarize(os.Stdin, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testsummary:", err)
		os.Exit(2)
	}
	if failed {
		os.Exit(1)
	}
}

func summarize(r io.Reader, w io.Writer) (failed bool, err error) {
	var (
		outputs                 = map[string][]string{} // package/test → output lines
		skipped                 []string
		passed, failedN, skippd int
		buildFailed             []string
	)
	scanner := bufio.NewScanner(r)
	scanner.Buffer(make([]byte, 1<<20), 16<<20)
	for scanner.Scan() {
		line := scanner.Bytes()
		var ev event
		if err := json.Unmarshal(line, &ev); err != nil {
			// Build errors arrive as plain text before the JSON stream.
			fmt.Fprintln(w, string(line))
			buildFailed = append(buildFailed, string(line))
			continue
		}
		key := ev.Package + " " + ev.Test
		switch ev.Action {
		case "output":
			outputs[key] = append(outputs[key], ev.Output)
		case "pass":
			if ev.Test == "" {
				fmt.Fprintf(w, "ok   %s\t%.2fs\n", ev.Package, ev.Elapsed)
			} else {
				passed++
			}
			delete(outputs, key)
		case "skip":
			if ev.Test == "" {
				fmt.Fprintf(w, "?    %s\t[no test files]\n", ev.Package)
				break
			}
			skippd++
			skipped = append(skipped, fmt.Sprintf("%s %s: %s", ev.Package, ev.Test, skipReason(outputs[key])))
			delete(outputs, key)
		case "fail":
			failed = true
			if ev.Test == "" {
				fmt.Fprintf(w, "FAIL %s\t%.2fs\n", ev.Package, ev.Elapsed)
				fmt.Fprint(w, strings.Join(outputs[key], ""))
			} else {
				failedN++
				fmt.Fprintf(w, "--- FAIL: %s %s\n%s", ev.Package, ev.Test, strings.Join(outputs[key], ""))
			}
			delete(outputs, key)
		}
	}
	if err := scanner.Err(); err != nil {
		return true, err
	}
	if len(skipped) > 0 {
		sort.Strings(skipped)
		fmt.Fprintf(w, "\nSkipped tests (%d):\n", len(skipped))
		for _, s := range skipped {
			fmt.Fprintln(w, "  "+s)
		}
	}
	if len(buildFailed) > 0 {
		failed = true
	}
	fmt.Fprintf(w, "\n%d passed, %d failed, %d skipped\n", passed, failedN, skippd)
	return failed, nil
}

// skipReason is the last line a skipped test logged, which is its t.Skip message.
func skipReason(lines []string) string {
	for i := len(lines) - 1; i >= 0; i-- {
		s := strings.TrimSpace(lines[i])
		if s == "" || strings.HasPrefix(s, "--- SKIP") || strings.HasPrefix(s, "=== ") {
			continue
		}
		return s
	}
	return "(no reason given)"
}
