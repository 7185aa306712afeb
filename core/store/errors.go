package store

import (
	"errors"
	"strings"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/berthhq/berth/internal/dirlock"
)

var (
	// ErrLocked is returned by [LockDir] when another process (or another LockDir in this
	// process) holds the directory's lock.
	ErrLocked = dirlock.ErrLocked
	// ErrNotFound is returned (wrapped) by [FindByID] and [UpdateIfRevision] when no document
	// has the given _id. Idempotent cleanup may treat it as success.
	ErrNotFound = errors.New("berth: document not found")
	// ErrConflict is returned (wrapped) by [UpdateIfRevision] when the document exists but its
	// revision is not the expected one: someone else changed it first.
	ErrConflict = errors.New("berth: revision conflict")
	// ErrWriteBatchTooLarge is returned (wrapped, inside the driver's connection error) by a
	// write to FerretDB whose one insert, update or delete command carries more than
	// [FerretWriteBatch] statements: a command the driver did not split itself, such as one sent
	// with RunCommand. Nothing is sent; the driver drops the connection and opens another. Split
	// the write, or use InsertMany or BulkWrite, which the driver splits (docs/store.md 2.1).
	ErrWriteBatchTooLarge = errors.New("berth: write command has more statements than FerretDB takes in one command")
)

// IsDuplicateKey reports whether err (or an error it wraps) says a unique index refused a
// write. It recognises MongoDB's E11000 family, which FerretDB also returns for inserts and
// upserts, and FerretDB v1's InternalError raised for a duplicate key by an update, replace or
// findAndModify ("UNIQUE constraint failed" from SQLite, SQLSTATE 23505 text from PostgreSQL).
func IsDuplicateKey(err error) bool {
	if err == nil {
		return false
	}
	if mongo.IsDuplicateKeyError(err) {
		return true
	}
	var ce mongo.CommandError
	if errors.As(err, &ce) && ce.Code == 1 && ce.Name == "InternalError" {
		return strings.Contains(ce.Message, "UNIQUE constraint failed") ||
			strings.Contains(ce.Message, "duplicate key value violates unique constraint")
	}
	return false
}
