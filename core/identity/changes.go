package identity

import (
	"context"
	"fmt"

	"github.com/berthhq/berth/core/changelog"
)

// Entity types of the change-log entries identity operations record
// (docs/node-protocol.md section 7.6).
const (
	EntityUser  = "user"
	EntityToken = "token"
)

// Change is where an identity write left its change-log item: the document
// (Collection and its _id, ID) whose outbox ([changelog.OutboxField]) holds
// it, in the same single-document write as the operation, and that outbox as
// the write left it (the operation's own change last). The zero Change (no
// Outbox) means the ctx carried no actor ([changelog.WithActor]) and nothing
// was recorded. ID may be a token's digest: it is for handing the outbox to
// the log ([changelog.Log.RecordOutbox]), never to be shown.
type Change struct {
	Collection string
	ID         string
	Outbox     []changelog.Pending
}

// logChange prepares the change-log item of an identity operation on the
// user or token entityID when ctx carries an actor; ok is false when it
// carries none, and the write records nothing. The payload names the
// action only: never a password, token or digest. Errors: those of
// [changelog.Prepare], wrapped.
func logChange(ctx context.Context, entityType, entityID, op, action string) (p changelog.Pending, ok bool, err error) {
	a, ok := changelog.ActorFrom(ctx)
	if !ok {
		return changelog.Pending{}, false, nil
	}
	p, err = changelog.Prepare(changelog.Change{ActorType: a.Type, ActorID: a.ID, IdempotencyKey: a.IdempotencyKey,
		EntityType: entityType, EntityID: entityID, Op: op, Payload: map[string]string{"action": action}})
	if err != nil {
		return changelog.Pending{}, false, fmt.Errorf("identity: %s %s: %w", entityType, entityID, err)
	}
	return p, true, nil
}

// upTo returns outbox up to and including the change with id, as read back
// after the write that put it there (a later write's change, if any, is
// not this one's to hand over); nil when it is gone already (appended).
func upTo(outbox []changelog.Pending, id string) []changelog.Pending {
	for i, p := range outbox {
		if p.ID == id {
			return outbox[:i+1]
		}
	}
	return nil
}
