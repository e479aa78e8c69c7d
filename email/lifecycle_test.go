package email

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postguard/postguard/db"
)

func requireTime(t *testing.T, want time.Time, got *time.Time, msgAndArgs ...any) {
	t.Helper()
	require.NotNil(t, got, msgAndArgs...)
	require.True(t, want.Equal(*got), "want %s, got %s", want, *got)
}

func TestRecord(t *testing.T) {
	t.Parallel()

	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	ptr := func(t time.Time) *time.Time { return &t }

	for _, tt := range []struct {
		name       string
		status     string     // the message's status before
		statusAt   *time.Time // and the time of the event that set it
		event      string
		eventAt    time.Time
		wantStatus string
		applied    bool
	}{
		{"AfterOwnStatus", StatusSent, nil, StatusDelivered, at(0), StatusDelivered, true},
		{"OwnStatusWhateverTheClock", StatusSent, nil, StatusDelivered, at(-3600), StatusDelivered, true},
		{"Later", StatusDelayed, ptr(at(1)), StatusDelivered, at(2), StatusDelivered, true},
		{"Older", StatusDelivered, ptr(at(2)), StatusDelayed, at(1), StatusDelivered, false},
		{"OlderComplaint", StatusBounced, ptr(at(2)), StatusComplained, at(1), StatusBounced, false},
		{"TieLaterRankWins", StatusDelivered, ptr(at(1)), StatusComplained, at(1), StatusComplained, true},
		{"TieEarlierRankLoses", StatusDelivered, ptr(at(1)), StatusDelayed, at(1), StatusDelivered, false},
		{"TieSentLoses", StatusDelayed, ptr(at(1)), StatusSent, at(1), StatusDelayed, false},
		{"TieSameRankFirstStays", StatusBounced, ptr(at(1)), StatusFailed, at(1), StatusBounced, false},
		{"SameStatusLater", StatusDelayed, ptr(at(1)), StatusDelayed, at(5), StatusDelayed, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			message := &db.EmailMessage{Status: tt.status, StatusAt: tt.statusAt}
			applied := Record(message, &Event{Status: tt.event, At: tt.eventAt})
			require.Equal(t, tt.applied, applied)
			require.Equal(t, tt.wantStatus, message.Status)
			if applied {
				requireTime(t, tt.eventAt, message.StatusAt)
			} else {
				require.Equal(t, tt.statusAt, message.StatusAt)
			}
			requireTime(t, tt.eventAt, *statusTime(message, tt.event), "the event's status time is recorded either way")
		})
	}

	t.Run("EarliestTimeAndBounceKept", func(t *testing.T) {
		t.Parallel()

		message := &db.EmailMessage{Status: StatusSent}
		Record(message, &Event{Status: StatusBounced, At: at(5), Bounce: &Bounce{Type: "Transient", SubType: "MailboxFull"}})
		Record(message, &Event{Status: StatusBounced, At: at(3), Bounce: &Bounce{Type: "Permanent", SubType: "General", Permanent: true}})
		Record(message, &Event{Status: StatusBounced, At: at(9), Bounce: &Bounce{Type: "Transient", SubType: "General"}})
		requireTime(t, at(3), message.BouncedAt)
		require.Equal(t, "Permanent", *message.BounceType, "the earliest bounce's")
		require.Equal(t, "General", *message.BounceSubType)
		requireTime(t, at(9), message.StatusAt)

		// A classification that is not a plain word is not kept.
		other := &db.EmailMessage{Status: StatusSent}
		Record(other, &Event{Status: StatusBounced, At: at(1), Bounce: &Bounce{Type: "Permanent", SubType: "550 <ada@example.com>", Permanent: true}})
		require.Equal(t, "Permanent", *other.BounceType)
		require.Nil(t, other.BounceSubType)
	})
}
