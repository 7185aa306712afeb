package backup

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sort"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	abierrors "github.com/berthhq/berth/abi/errors"
)

// collName is what a collection name may be to become an archive path.
var collName = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,119}$`)

// maxDocLine bounds one exported document line (BSON's own limit is 16 MiB; its
// extended JSON is larger).
const maxDocLine = 64 << 20

// exportMongo writes every collection of database db as canonical extended JSON,
// one document a line, to tmp/<collection>.jsonl. On a replica set all reads
// share one snapshot session, so the export is one point in time; a server
// without snapshot reads (a standalone server, FerretDB) is read collection by
// collection, and each is consistent only on its own.
func exportMongo(ctx context.Context, uri, db, tmp string, log *slog.Logger) ([]source, error) {
	client, err := mongo.Connect(options.Client().ApplyURI(uri).SetAppName("berthd-backup"))
	if err != nil {
		return nil, fmt.Errorf("backup: connect to MongoDB: %w", err)
	}
	defer func() { _ = client.Disconnect(context.WithoutCancel(ctx)) }()
	d := client.Database(db)
	names, err := d.ListCollectionNames(ctx, bson.D{})
	if err != nil {
		return nil, fmt.Errorf("backup: list collections of %s: %w", db, err)
	}
	sort.Strings(names)
	rctx := ctx
	if sess, err := client.StartSession(options.Session().SetSnapshot(true)); err == nil {
		defer sess.EndSession(context.WithoutCancel(ctx))
		sctx := mongo.NewSessionContext(ctx, sess)
		// A first read tells whether the server serves snapshot reads at all.
		if len(names) > 0 {
			if err := d.Collection(names[0]).FindOne(sctx, bson.D{}).Err(); err == nil || errors.Is(err, mongo.ErrNoDocuments) {
				rctx = sctx
			}
		}
	}
	if rctx == ctx && len(names) > 0 {
		log.Warn("backup: the MongoDB server serves no snapshot reads; each collection is exported consistent on its own, not all at one instant")
	}
	var out []source
	for _, name := range names {
		if !collName.MatchString(name) {
			return nil, fmt.Errorf("backup: collection name %q cannot be archived", name)
		}
		dst := filepath.Join(tmp, name+".jsonl")
		if err := exportCollection(rctx, d.Collection(name), dst); err != nil {
			return nil, err
		}
		f, err := hashFile(dst, "mongo/"+name+".jsonl", 0o600)
		if err != nil {
			return nil, err
		}
		out = append(out, source{File: f, from: dst})
	}
	return out, nil
}

func exportCollection(ctx context.Context, coll *mongo.Collection, dst string) error {
	cur, err := coll.Find(ctx, bson.D{}, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		return fmt.Errorf("backup: read %s: %w", coll.Name(), err)
	}
	defer cur.Close(context.WithoutCancel(ctx))
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	defer f.Close()
	w := bufio.NewWriter(f)
	for cur.Next(ctx) {
		line, err := bson.MarshalExtJSON(cur.Current, true, false)
		if err != nil {
			return fmt.Errorf("backup: encode a document of %s: %w", coll.Name(), err)
		}
		if _, err := w.Write(append(line, '\n')); err != nil {
			return fmt.Errorf("backup: %w", err)
		}
	}
	if err := cur.Err(); err != nil {
		return fmt.Errorf("backup: read %s: %w", coll.Name(), err)
	}
	if err := w.Flush(); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	return f.Sync()
}

// importer loads a MongoDB export into an empty database.
type importer struct {
	client *mongo.Client
	db     *mongo.Database
}

// newImporter connects and refuses a database that already holds a collection.
func newImporter(ctx context.Context, uri, db string) (*importer, error) {
	client, err := mongo.Connect(options.Client().ApplyURI(uri).SetAppName("berthd-restore"))
	if err != nil {
		return nil, fmt.Errorf("backup: connect to MongoDB: %w", err)
	}
	d := client.Database(db)
	names, err := d.ListCollectionNames(ctx, bson.D{})
	if err != nil {
		_ = client.Disconnect(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("backup: list collections of %s: %w", db, err)
	}
	if len(names) > 0 {
		_ = client.Disconnect(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("backup: MongoDB database %s holds collection %s: restore only into an empty database: %w", db, names[0], ErrNotEmpty)
	}
	return &importer{client: client, db: d}, nil
}

func (im *importer) close() { _ = im.client.Disconnect(context.Background()) }

// load inserts every line of r into collection name, in batches of 500.
// Inserting the same _id twice fails, so a repeated load cannot duplicate.
func (im *importer) load(ctx context.Context, name string, r io.Reader) error {
	coll := im.db.Collection(name)
	if err := im.db.CreateCollection(ctx, name); err != nil {
		return fmt.Errorf("backup: create collection %s: %w", name, err)
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<20), maxDocLine)
	var batch []any
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		if _, err := coll.InsertMany(ctx, batch, options.InsertMany().SetOrdered(true)); err != nil {
			return fmt.Errorf("backup: import into %s: %w", name, err)
		}
		batch = batch[:0]
		return nil
	}
	for sc.Scan() {
		var doc bson.D
		if err := bson.UnmarshalExtJSON(sc.Bytes(), true, &doc); err != nil {
			return abierrors.Wrap(abierrors.BackupInvalid, fmt.Sprintf("backup: a document of %s is not canonical extended JSON", name), err)
		}
		batch = append(batch, doc)
		if len(batch) == 500 {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("backup: read export of %s: %w", name, err)
	}
	return flush()
}
