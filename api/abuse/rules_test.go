package abuse

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseLimit(t *testing.T) {
	t.Parallel()

	tests := []struct {
		in      string
		limit   int64
		window  time.Duration
		wantErr string // substring; "" means valid
	}{
		{in: "5/15m", limit: 5, window: 15 * time.Minute},
		{in: "3/1h", limit: 3, window: time.Hour},
		{in: "1/1s", limit: 1, window: time.Second},
		{in: "100/90s", limit: 100, window: 90 * time.Second},
		{in: "6/1h30m", limit: 6, window: 90 * time.Minute},
		{in: " 5 / 15m ", limit: 5, window: 15 * time.Minute},
		{in: "9223372036854775807/24h", limit: 1<<63 - 1, window: 24 * time.Hour},

		{in: "", wantErr: "missing '/'"},
		{in: "5", wantErr: "missing '/'"},
		{in: "15m", wantErr: "missing '/'"},
		{in: "/15m", wantErr: "count \"\" is not an integer"},
		{in: "5/", wantErr: "window \"\" is not a duration"},
		{in: "five/15m", wantErr: "is not an integer"},
		{in: "5.5/15m", wantErr: "is not an integer"},
		{in: "0x5/15m", wantErr: "is not an integer"},
		{in: "99999999999999999999/1m", wantErr: "is not an integer"},
		{in: "5/15", wantErr: "is not a duration"},
		{in: "5/m", wantErr: "is not a duration"},
		{in: "5/15m/2", wantErr: "is not a duration"},
		{in: "0/15m", wantErr: "limit 0 must be at least 1"},
		{in: "-1/15m", wantErr: "limit -1 must be at least 1"},
		{in: "5/0s", wantErr: "must be at least 1s"},
		{in: "5/-15m", wantErr: "must be at least 1s"},
		{in: "5/999ms", wantErr: "must be at least 1s"},
		{in: "5/1500ms", wantErr: "whole number of seconds"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()

			limit, window, err := ParseLimit(tt.in)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				require.ErrorContains(t, err, "want N/DURATION", "the error says what is expected")
				require.Zero(t, limit)
				require.Zero(t, window)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.limit, limit)
			require.Equal(t, tt.window, window)
		})
	}
}

func TestDefaultRules(t *testing.T) {
	t.Parallel()

	rules := DefaultRules()
	require.NoError(t, rules.Validate())
	require.Equal(t, []Rule{
		{Action: ActionRegister, Scope: ScopeIP, Limit: 5, Window: 15 * time.Minute},
		{Action: ActionRegister, Scope: ScopeEmail, Limit: 3, Window: time.Hour},
		{Action: ActionForgotPassword, Scope: ScopeIP, Limit: 5, Window: 15 * time.Minute},
		{Action: ActionForgotPassword, Scope: ScopeEmail, Limit: 3, Window: time.Hour},
		{Action: ActionResendVerification, Scope: ScopeIP, Limit: 6, Window: 15 * time.Minute},
		{Action: ActionResendVerification, Scope: ScopeEmail, Limit: 3, Window: 30 * time.Minute},
		{Action: ActionResetPassword, Scope: ScopeIP, Limit: 10, Window: 15 * time.Minute},
		{Action: ActionRiverUILogin, Scope: ScopeIP, Limit: 10, Window: 15 * time.Minute},
	}, rules.All())
}

func TestRule_Names(t *testing.T) {
	t.Parallel()

	tests := []struct {
		action Action
		scope  Scope
		env    string
		policy string
	}{
		{ActionRegister, ScopeIP, "RATE_LIMIT_REGISTER_IP", "register-ip"},
		{ActionRegister, ScopeEmail, "RATE_LIMIT_REGISTER_EMAIL", "register-email"},
		{ActionForgotPassword, ScopeIP, "RATE_LIMIT_FORGOT_PASSWORD_IP", "forgot-password-ip"},
		{ActionForgotPassword, ScopeEmail, "RATE_LIMIT_FORGOT_PASSWORD_EMAIL", "forgot-password-email"},
		{ActionResendVerification, ScopeIP, "RATE_LIMIT_RESEND_VERIFICATION_IP", "resend-verification-ip"},
		{ActionResendVerification, ScopeEmail, "RATE_LIMIT_RESEND_VERIFICATION_EMAIL", "resend-verification-email"},
	}
	for _, tt := range tests {
		rule := Rule{Action: tt.action, Scope: tt.scope}
		require.Equal(t, tt.env, rule.EnvName())
		require.Equal(t, tt.policy, rule.PolicyName())
	}
}

func TestRule_Validate(t *testing.T) {
	t.Parallel()

	valid := Rule{Action: ActionRegister, Scope: ScopeIP, Limit: 5, Window: time.Minute}
	require.NoError(t, valid.Validate())

	for name, mutate := range map[string]func(r *Rule){
		"EmptyAction":    func(r *Rule) { r.Action = "" },
		"ColonInAction":  func(r *Rule) { r.Action = "a:b" },
		"UpperAction":    func(r *Rule) { r.Action = "Register" },
		"UnknownScope":   func(r *Rule) { r.Scope = "user" },
		"DigitFirst":     func(r *Rule) { r.Action = "2fa" },
		"TooLong":        func(r *Rule) { r.Action = Action(strings.Repeat("a", 33)) },
		"BuiltInKey":     func(r *Rule) { r.Scope = ScopeKey },
		"ZeroLimit":      func(r *Rule) { r.Limit = 0 },
		"ZeroWindow":     func(r *Rule) { r.Window = 0 },
		"SubSecond":      func(r *Rule) { r.Window = 500 * time.Millisecond },
		"FractionalSecs": func(r *Rule) { r.Window = 1500 * time.Millisecond },
	} {
		rule := valid
		mutate(&rule)
		require.Error(t, rule.Validate(), name)
		require.Error(t, DefaultRules().With(rule).Validate(), name)
	}
}

func TestRules_With(t *testing.T) {
	t.Parallel()

	defaults := DefaultRules()

	t.Run("ReplacesInPlace", func(t *testing.T) {
		t.Parallel()

		override := Rule{Action: ActionForgotPassword, Scope: ScopeEmail, Limit: 10, Window: 2 * time.Hour}
		rules := defaults.With(override)

		got, ok := rules.Get(ActionForgotPassword, ScopeEmail)
		require.True(t, ok)
		require.Equal(t, override, got)
		require.Len(t, rules.All(), len(defaults.All()))
		require.Equal(t, override, rules.All()[3], "order is kept")

		// The original is untouched.
		got, ok = defaults.Get(ActionForgotPassword, ScopeEmail)
		require.True(t, ok)
		require.Equal(t, int64(3), got.Limit)
	})

	t.Run("AddsNew", func(t *testing.T) {
		t.Parallel()

		rules := Rules{}.With(Rule{Action: "login", Scope: ScopeIP, Limit: 1, Window: time.Second})
		require.Len(t, rules.All(), 1)
		_, ok := rules.Get("login", ScopeEmail)
		require.False(t, ok)
	})

	t.Run("AllIsACopy", func(t *testing.T) {
		t.Parallel()

		all := defaults.All()
		all[0].Limit = 1000
		got, _ := defaults.Get(ActionRegister, ScopeIP)
		require.Equal(t, int64(5), got.Limit)
	})
}

func TestRules_WithEnviron(t *testing.T) {
	t.Parallel()

	t.Run("Overrides", func(t *testing.T) {
		t.Parallel()

		rules, err := DefaultRules().WithEnviron([]string{
			"RATE_LIMIT_REGISTER_IP=50/1m",
			"RATE_LIMIT_RESEND_VERIFICATION_EMAIL=1/24h",
			"RATE_LIMIT_FORGOT_PASSWORD_IP=", // empty keeps the default
			"PATH=/usr/bin",
		})
		require.NoError(t, err)

		got, _ := rules.Get(ActionRegister, ScopeIP)
		require.Equal(t, Rule{Action: ActionRegister, Scope: ScopeIP, Limit: 50, Window: time.Minute}, got)
		got, _ = rules.Get(ActionResendVerification, ScopeEmail)
		require.Equal(t, Rule{Action: ActionResendVerification, Scope: ScopeEmail, Limit: 1, Window: 24 * time.Hour}, got)
		got, _ = rules.Get(ActionForgotPassword, ScopeIP)
		require.Equal(t, int64(5), got.Limit)
		require.Len(t, rules.All(), len(DefaultRules().All()), "overrides add no rule")
	})

	t.Run("CustomActions", func(t *testing.T) {
		t.Parallel()

		rules, err := DefaultRules().WithEnviron([]string{
			"RATE_LIMIT_LOGIN_KEY=5/15m",
			"RATE_LIMIT_LOGIN_IP=20/15m",
			"RATE_LIMIT_API_KEY_V2_EMAIL=3/1h",
			"RATE_LIMIT_LOGIN_KEY_IP=7/1m", // action LOGIN_KEY, scope IP
			"RATE_LIMIT_LOGIN_EMAIL=",      // empty: no rule
		})
		require.NoError(t, err)

		want := []Rule{
			{Action: "api_key_v2", Scope: ScopeEmail, Limit: 3, Window: time.Hour},
			{Action: "login", Scope: ScopeIP, Limit: 20, Window: 15 * time.Minute},
			{Action: "login", Scope: ScopeKey, Limit: 5, Window: 15 * time.Minute},
			{Action: "login_key", Scope: ScopeIP, Limit: 7, Window: time.Minute},
		}
		require.Equal(t, want, rules.All()[len(DefaultRules().All()):], "added after the built-in rules, sorted by variable")
		_, ok := rules.Get("login", ScopeEmail)
		require.False(t, ok)
		require.Equal(t, []Action{ActionRegister, ActionForgotPassword, ActionResendVerification, ActionResetPassword, ActionRiverUILogin, "api_key_v2", "login", "login_key"}, rules.Actions())
		require.NoError(t, rules.Validate())
	})

	t.Run("ErrorsNameVariables", func(t *testing.T) {
		t.Parallel()

		tests := []struct {
			env  string
			want string
		}{
			{"RATE_LIMIT_FORGOT_PASSWORD_EMAIL=0/1h", "at least 1"},
			{"RATE_LIMIT_LOGIN_KEY=5", "missing '/'"},
			{"RATE_LIMIT_LOGIN_USER=5/15m", `unknown scope "USER"`},
			{"RATE_LIMIT_LOGIN_ip=5/15m", `unknown scope "ip"`},
			{"RATE_LIMIT_login_IP=5/15m", `invalid action "login"`},
			{"RATE_LIMIT_1LOGIN_IP=5/15m", `invalid action "1LOGIN"`},
			{"RATE_LIMIT__IP=5/15m", `invalid action ""`},
			{"RATE_LIMIT_LOG-IN_IP=5/15m", `invalid action "LOG-IN"`},
			{"RATE_LIMIT_" + strings.Repeat("A", 33) + "_IP=5/15m", "invalid action"},
			{"RATE_LIMIT_LOGIN=5/15m", "not a rule variable"},
			{"RATE_LIMIT_IP=5/15m", "not a rule variable"},
			{"RATE_LIMIT_REGISTER_KEY=5/15m", "the built-in action register counts by ip and email only, not by key"},
			{"RATE_LIMIT_RESET_PASSWORD_EMAIL=5/15m", "the built-in action reset_password counts by ip only, not by email"},
		}
		for _, tt := range tests {
			_, err := DefaultRules().WithEnviron([]string{tt.env})
			name, _, _ := strings.Cut(tt.env, "=")
			require.ErrorContains(t, err, name+": ", tt.env)
			require.ErrorContains(t, err, tt.want, tt.env)
		}

		// Every bad variable is reported at once.
		_, err := DefaultRules().WithEnviron([]string{"RATE_LIMIT_A_IP=x", "RATE_LIMIT_B_IP=0/1m", "RATE_LIMIT_C_IP=1/1m"})
		require.ErrorContains(t, err, "RATE_LIMIT_A_IP")
		require.ErrorContains(t, err, "RATE_LIMIT_B_IP")
		require.NotContains(t, err.Error(), "RATE_LIMIT_C_IP")
	})

	t.Run("ActionNameBound", func(t *testing.T) {
		t.Parallel()

		longest := strings.Repeat("A", 32)
		rules, err := Rules{}.WithEnviron([]string{"RATE_LIMIT_" + longest + "_KEY=1/1s"})
		require.NoError(t, err)
		_, ok := rules.Get(Action(strings.ToLower(longest)), ScopeKey)
		require.True(t, ok)
	})
}

func TestParseRuleEnv(t *testing.T) {
	t.Parallel()

	rule, ok, err := ParseRuleEnv("RATE_LIMIT_LOGIN_KEY", " 5 / 15m ")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, Rule{Action: "login", Scope: ScopeKey, Limit: 5, Window: 15 * time.Minute}, rule)
	require.Equal(t, "RATE_LIMIT_LOGIN_KEY", rule.EnvName(), "round-trips")
	require.Equal(t, "login-key", rule.PolicyName())

	for _, name := range []string{"HOME", "RATE_LIMITS", "rate_limit_login_ip"} {
		_, ok, err := ParseRuleEnv(name, "5/15m")
		require.NoError(t, err, name)
		require.False(t, ok, name)
	}
}
