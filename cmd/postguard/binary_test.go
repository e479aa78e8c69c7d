package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

var (
	binaryOnce sync.Once
	binaryPath string
	binaryErr  error
	binaryOut  []byte
)

// buildPostguard builds the postguard binary once per test process, for tests that run it as a
// separate process (kill -9, SIGTERM, deploy scripts), and returns its path.
func buildPostguard(t testing.TB) string {
	t.Helper()

	binaryOnce.Do(func() {
		dir, err := os.MkdirTemp("", "postguard-bin-")
		if err != nil {
			binaryErr = err
			return
		}
		binaryPath = filepath.Join(dir, "postguard")
		cmd := exec.Command("go", "build", "-o", binaryPath, ".")
		binaryOut, binaryErr = cmd.CombinedOutput()
	})
	if binaryErr != nil {
		t.Fatalf("error building postguard: %v\n%s", binaryErr, binaryOut)
	}
	return binaryPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binaryPath != "" {
		os.RemoveAll(filepath.Dir(binaryPath))
	}
	os.Exit(code)
}
