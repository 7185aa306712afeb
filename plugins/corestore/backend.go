package corestore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"

	"github.com/berthhq/berth/abi/bindings"
	abierrors "github.com/berthhq/berth/abi/errors"
)

// names are a binding's names on its server.
type names struct {
	ID       string // <project>/<service>/<binding>
	Database string // database or bucket
	User     string // role, user or access key id
}

// backend is one server kind. Every method honours ctx; an error wrapping
// errUnreachable means the server did not answer.
type backend interface {
	// plan fills what the server kind adds to a state: database, user,
	// endpoint and users.
	plan(ctx context.Context, n names) (bindings.State, error)
	// ensure makes the database and the user exist with password,
	// creating what is missing and setting the password of what exists.
	ensure(ctx context.Context, n names, password string) error
	// exists reports whether the database exists.
	exists(ctx context.Context, n names) (bool, error)
	// purge drops the database and the user; absent ones are success.
	purge(ctx context.Context, n names) error
	// list returns the names of every database the plugin made.
	list(ctx context.Context) ([]string, error)
	// credentials are the values a workload gets for n.
	credentials(st bindings.State, password string) map[string]string
}

// errUnreachable marks a server that did not answer.
var errUnreachable = errors.New("corestore: server unreachable")

// unreachable wraps err as a server that did not answer what.
func unreachable(what string, err error) error {
	return abierrors.Wrap(abierrors.BindingUnavailable, what, fmt.Errorf("%w: %w", errUnreachable, err))
}

func hostPort(host string, port int) string { return net.JoinHostPort(host, strconv.Itoa(port)) }

func strictDecode(raw json.RawMessage, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return abierrors.Wrap(abierrors.ValidationFailed, "does not decode", err)
	}
	return nil
}
