package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/postguard/postguard/cmd/internal/service"
)

//nolint:gosec // G101: the usage text of `postguard secret`, not a credential
const secretUsage = `Usage: postguard secret reset --yes

Records the check value of this process's secret (APP_SECRET, or on the embedded default the
secret file beside the database, made anew if it was lost) as the database's, in place of the
secret the database was made with. Until then every process whose secret differs from the
database's refuses to start. It reads DATABASE_URL and APP_SECRET.

What the old secret made stops working: unsubscribe links already mailed, the suppression list,
the rate-limit counters of the current windows, links in mail not yet sent, trusted-device
tokens. --yes says you mean it; without it nothing changes.
`

// errNotConfirmed is returned by `secret reset` without --yes, after it said what a reset breaks.
var errNotConfirmed = errors.New("secret reset not confirmed: nothing changed (run `postguard secret reset --yes` to reset)")

// secretResetCommand records a new secret's check value as the database's.
type secretResetCommand struct {
	// yes confirms the reset; without it the command only says what a reset would break.
	yes bool
}

// parseSecretCommand reads `secret reset [--yes]`; args are those after "secret".
func parseSecretCommand(args []string, stderr io.Writer) (*secretResetCommand, error) {
	if len(args) == 0 || args[0] != "reset" {
		fmt.Fprint(stderr, secretUsage)
		return nil, errUsage
	}
	cmd := &secretResetCommand{}
	flags := flag.NewFlagSet("postguard secret reset", flag.ContinueOnError)
	flags.SetOutput(io.Discard)
	flags.BoolVar(&cmd.yes, "yes", false, "record the new secret, breaking what the old one made")
	if err := flags.Parse(args[1:]); err != nil || flags.NArg() > 0 {
		if err == nil {
			err = fmt.Errorf("unexpected argument %q", flags.Arg(0))
		}
		fmt.Fprintf(stderr, "postguard: %v\n\n%s", err, secretUsage)
		return nil, errUsage
	}
	return cmd, nil
}

func (c *secretResetCommand) Run(ctx context.Context, env *commandEnv) error {
	cfg, err := loadSecretConfig(env.Environ)
	if err != nil {
		return fmt.Errorf("configuration error:\n%w", err)
	}
	source := service.SecretSource(cfg)
	if _, err := fmt.Fprintf(env.Stdout, "postguard: a secret reset makes %s the database's secret. From then on, %s.\n", source, service.SecretChangeBreaks); err != nil {
		return err
	}
	if !c.yes {
		return errNotConfirmed
	}

	changed, err := service.ResetSecret(ctx, cfg, newLogger(cfg, env.Stderr))
	if err != nil {
		return err
	}
	if !changed {
		_, err = fmt.Fprintf(env.Stdout, "postguard: the database records %s already; nothing was replaced\n", source)
		return err
	}
	_, err = fmt.Fprintf(env.Stdout, "postguard: the database now records %s; start every process with it\n", source)
	return err
}
