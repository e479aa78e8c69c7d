package service

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDevMailServed(t *testing.T) {
	t.Parallel()

	for appURL, want := range map[string]bool{
		"http://localhost:8080":      true,
		"http://LOCALHOST":           true,
		"http://app.localhost:3000":  true,
		"http://127.0.0.1:8080":      true,
		"http://127.1.2.3":           true,
		"http://[::1]:8080":          true,
		"https://auth.example.com":   false,
		"http://192.168.1.20:8080":   false,
		"http://localhost.evil.test": false,
		"http://[::ffff:10.0.0.1]":   false,
		"::":                         false,
	} {
		require.Equal(t, want, DevMailServed(appURL), appURL)
	}
}
