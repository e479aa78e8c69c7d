package tokens_test

import (
	"fmt"

	"github.com/postguard/postguard/tokens"
)

// A link token is random; the database keeps its hash, and a sealed copy only while its job may
// still resend it.
func ExampleSealer() {
	sealer, err := tokens.NewSealer([]byte("an example secret of 32 bytes..."))
	if err != nil {
		panic(err)
	}

	raw := tokens.New()
	sealed := sealer.Seal(raw, 7, "reset")

	again, err := sealer.Open(sealed, 7, "reset")
	fmt.Println(len(raw), len(tokens.Hash(raw)), again == raw, err)

	_, err = sealer.Open(sealed, 8, "reset")
	fmt.Println(err)
	// Output:
	// 43 32 true <nil>
	// sealed token does not open
}

// An unsubscribe link's token names its user and proves the app made it.
func ExampleParseUnsubscribe() {
	secret := []byte("an example secret of 32 bytes...")

	tok := tokens.Unsubscribe(secret, 42)
	userID, ok := tokens.ParseUnsubscribe(secret, tok)
	fmt.Println(userID, ok)

	_, ok = tokens.ParseUnsubscribe(secret, "43"+tok[2:])
	fmt.Println(ok)
	// Output:
	// 42 true
	// false
}
