package mail

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestOutbox(t *testing.T) {
	t.Parallel()

	t.Run("KeepsTheLastNewestFirst", func(t *testing.T) {
		t.Parallel()

		outbox := NewOutbox(3)
		start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
		for i := range 5 {
			outbox.Add("log_"+strconv.Itoa(i), start.Add(time.Duration(i)*time.Second), &Message{To: "ada@example.com", Subject: "mail " + strconv.Itoa(i)})
		}

		list := outbox.List()
		require.Len(t, list, 3)
		for i, want := range []string{"log_4", "log_3", "log_2"} {
			require.Equal(t, want, list[i].ID)
		}
		require.Equal(t, "mail 4", list[0].Message.Subject)
		require.Equal(t, start.Add(4*time.Second), list[0].SentAt)

		_, ok := outbox.Get("log_1")
		require.False(t, ok, "forgotten beyond the size")
		got, ok := outbox.Get("log_2")
		require.True(t, ok)
		require.Equal(t, "mail 2", got.Message.Subject)
	})

	t.Run("KeepsACopy", func(t *testing.T) {
		t.Parallel()

		outbox := NewOutbox(0)
		msg := &Message{Subject: "before", Headers: map[string]string{"A": "before"}}
		outbox.Add("log_1", time.Now(), msg)
		msg.Subject, msg.Headers["A"] = "after", "after"

		got, ok := outbox.Get("log_1")
		require.True(t, ok)
		require.Equal(t, "before", got.Message.Subject)
		require.Equal(t, "before", got.Message.Headers["A"])
	})

	t.Run("DefaultSize", func(t *testing.T) {
		t.Parallel()

		outbox := NewOutbox(0)
		for i := range DefaultOutboxSize + 1 {
			outbox.Add("log_"+strconv.Itoa(i), time.Now(), &Message{})
		}
		require.Len(t, outbox.List(), DefaultOutboxSize)
	})
}
