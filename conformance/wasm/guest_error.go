package wasm

import (
	"errors"

	abiwasm "github.com/berthhq/berth/abi/wasm"
)

func asGuest(err error, target **abiwasm.GuestError) bool { return errors.As(err, target) }
