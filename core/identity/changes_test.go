package identity_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/berthhq/berth/abi/node"
	"github.com/berthhq/berth/core/changelog"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/store"
)

// TestIdentityChangesSurviveDeathBeforeAppend: each identity operation,
// made with an actor in its ctx, commits its change in the same write, and
// berthd "dies" before handing it to the log. At the next start a fresh
// Log's Recover appends exactly one entry for it (who, what, the
// Idempotency-Key, no secret), a second Recover none; a refused write of
// the same kind leaves nothing. Before, these entries were appended only
// after the write, so a kill in between lost them.
func TestIdentityChangesSurviveDeathBeforeAppend(t *testing.T) {
	ctx := context.Background()
	tokens, st, _ := newUsers(t)
	actx := changelog.WithActor(ctx, changelog.Actor{Type: "human", ID: "user:root", IdempotencyKey: "key-0001"})
	if _, err := tokens.CreateUser(ctx, identity.NewUserRequest{Name: "bob", Kind: identity.KindHuman, Password: goodPassword}); err != nil {
		t.Fatal(err)
	}
	made := map[string]string{}
	for _, name := range []string{"to-revoke", "to-rotate"} {
		tok, _, err := tokens.CreateMachine(ctx, identity.MachineTokenRequest{Name: name, Scopes: []identity.Scope{identity.ScopeServicesRead}})
		if err != nil {
			t.Fatal(err)
		}
		made[name] = tok
	}
	const newPassword = "a new password that is long enough"
	cases := []struct {
		name, entityType, entityID, op, action string
		// do makes the write and returns the change it reports and the secrets it handled.
		do func() (identity.Change, []string, error)
		// refused is a write of the same kind that must fail and record nothing.
		refused func() error
	}{
		{"create user", identity.EntityUser, "carol", node.OpCreate, "create user",
			func() (identity.Change, []string, error) {
				u, err := tokens.CreateUser(actx, identity.NewUserRequest{Name: "carol", Kind: identity.KindHuman, Password: goodPassword})
				return u.Change, []string{goodPassword}, err
			},
			func() error {
				_, err := tokens.CreateUser(actx, identity.NewUserRequest{Name: "carol", Kind: identity.KindHuman})
				return err
			}},
		{"rotate password", identity.EntityUser, "bob", node.OpUpdate, "credential rotate_password",
			func() (identity.Change, []string, error) {
				u, err := tokens.ChangeCredential(actx, "bob", 1, identity.OpRotatePassword, newPassword)
				return u.Change, []string{newPassword, goodPassword}, err
			},
			func() error {
				_, err := tokens.ChangeCredential(actx, "bob", 1, identity.OpRotatePassword, newPassword) // generation moved
				return err
			}},
		{"revoke sessions", identity.EntityUser, "bob", node.OpUpdate, "credential revoke_sessions",
			func() (identity.Change, []string, error) {
				u, err := tokens.ChangeCredential(actx, "bob", 0, identity.OpRevokeSessions, "")
				return u.Change, nil, err
			},
			func() error {
				_, err := tokens.ChangeCredential(actx, "bob", 0, "drop_everything", "")
				return err
			}},
		{"set roles", identity.EntityUser, "bob", node.OpUpdate, "set roles",
			func() (identity.Change, []string, error) {
				u, err := tokens.SetRoles(actx, "bob", []identity.Role{identity.RoleOperator}, nil)
				return u.Change, nil, err
			},
			func() error {
				_, err := tokens.SetRoles(actx, "bob", []identity.Role{"root"}, nil)
				return err
			}},
		{"create token", identity.EntityToken, "ci", node.OpCreate, "create token",
			func() (identity.Change, []string, error) {
				tok, info, err := tokens.CreateMachine(actx, identity.MachineTokenRequest{Name: "ci", Scopes: []identity.Scope{identity.ScopeServicesRead}})
				return info.Change, []string{tok, identity.Digest(tok)}, err
			},
			func() error {
				_, _, err := tokens.CreateMachine(actx, identity.MachineTokenRequest{Name: "ci", Scopes: []identity.Scope{identity.ScopeServicesRead}})
				return err
			}},
		{"revoke token", identity.EntityToken, "to-revoke", node.OpUpdate, "revoke token",
			func() (identity.Change, []string, error) {
				ch, err := tokens.RevokeMachine(actx, "to-revoke")
				return ch, []string{made["to-revoke"], identity.Digest(made["to-revoke"])}, err
			},
			func() error {
				_, err := tokens.RevokeMachine(actx, "to-revoke") // gone already
				return err
			}},
		{"rotate token", identity.EntityToken, "to-rotate", node.OpUpdate, "rotate token",
			func() (identity.Change, []string, error) {
				tok, info, err := tokens.RotateMachine(actx, "to-rotate")
				return info.Change, []string{tok, identity.Digest(tok), made["to-rotate"], identity.Digest(made["to-rotate"])}, err
			},
			func() error {
				_, _, err := tokens.RotateMachine(actx, "unknown")
				return err
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ch, secrets, err := tc.do()
			if err != nil {
				t.Fatal(err)
			}
			if len(ch.Outbox) != 1 || ch.Collection == "" || ch.ID == "" {
				t.Fatalf("change %+v; want one pending change in the written document", ch)
			}
			if err := tc.refused(); err == nil {
				t.Fatalf("the refused write succeeded")
			}
			// The write's change is never handed over: the next start finds it.
			l := changelog.New(st, 1, nil)
			for _, c := range []string{identity.UsersCollection, identity.TokensCollection, identity.TokenNamesCollection} {
				l.TrackOutbox(c, "")
			}
			head, _, err := l.Head(ctx)
			if err != nil {
				t.Fatal(err)
			}
			n, err := l.Recover(ctx)
			if err != nil || n != 1 {
				t.Fatalf("recover: %d, %v; want 1 entry", n, err)
			}
			entries, err := l.Range(ctx, head+1, 0)
			if err != nil || len(entries) != 1 {
				t.Fatalf("entries after %d: %d, %v; want 1", head, len(entries), err)
			}
			e := entries[0]
			var payload map[string]string
			if err := json.Unmarshal(e.Payload, &payload); err != nil {
				t.Fatalf("payload %s: %v", e.Payload, err)
			}
			if e.EntityType != tc.entityType || e.EntityID != tc.entityID || e.Op != tc.op || payload["action"] != tc.action ||
				e.ActorID != "user:root" || e.IdempotencyKey != "key-0001" || len(payload) != 1 {
				t.Fatalf("entry %+v payload %s; want %s %s %s %q by user:root with key-0001", e, e.Payload, tc.entityType, tc.entityID, tc.op, tc.action)
			}
			raw, _ := json.Marshal(e)
			for _, sec := range secrets {
				if strings.Contains(string(raw), sec) {
					t.Fatalf("entry %s holds a secret", raw)
				}
			}
			if n, err := l.Recover(ctx); err != nil || n != 0 {
				t.Fatalf("recover again: %d, %v; want 0", n, err)
			}
		})
	}
	// Without an actor nothing is recorded.
	u, err := tokens.SetRoles(ctx, "bob", nil, nil)
	if err != nil || len(u.Change.Outbox) != 0 {
		t.Fatalf("set roles without actor: %+v, %v; want no change", u.Change, err)
	}
	if _, err := tokens.RevokeMachine(actx, "unknown"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("revoke unknown: %v", err)
	}
}
