package backup

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"sort"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// MongoMagic opens every MongoDB archive (docs/backups.md section 3.2):
// format name and version 1.
const MongoMagic = "BERTHMG1"

// Record tags of a MongoDB archive: after MongoMagic, a sequence of one tag
// byte followed by one BSON document.
const (
	mongoTagCollection byte = 'C' // {name: string, indexes: [index specification documents]}
	mongoTagDocument   byte = 'D' // one document of the collection named last, as stored
	mongoTagEnd        byte = 'E' // {collections: int64, documents: int64}; nothing follows
)

// mongoBatch bounds one insert during a restore.
const (
	mongoBatchDocs  = 1000
	mongoBatchBytes = 8 << 20
)

// MongoDB is the engine of one MongoDB-wire server, reached with a URI whose
// user may create and drop databases (docs/backups.md section 3.2). A
// database is archived collection by collection, each with its index
// specifications and then its documents in _id order.
type MongoDB struct {
	URI string // mongodb://user:password@host:port/ (credentials stay in memory)
}

var _ Engine = (*MongoDB)(nil)

// Kind implements Engine.
func (m *MongoDB) Kind() Kind { return KindMongoDB }

func (m *MongoDB) client(ctx context.Context) (*mongo.Client, error) {
	c, err := mongo.Connect(options.Client().ApplyURI(m.URI))
	if err != nil {
		return nil, fmt.Errorf("mongodb client: %w", err)
	}
	if err := c.Ping(ctx, nil); err != nil {
		_ = c.Disconnect(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("reach mongodb: %w: %w", ErrUnreachable, err)
	}
	return c, nil
}

// collections lists db's collections in name order, without system ones.
func collections(ctx context.Context, db *mongo.Database) ([]string, error) {
	names, err := db.ListCollectionNames(ctx, bson.D{})
	if err != nil {
		return nil, fmt.Errorf("list collections of %s: %w", db.Name(), err)
	}
	out := names[:0]
	for _, n := range names {
		if !strings.HasPrefix(n, "system.") {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out, nil
}

// walk calls fn with every document of coll in _id order and returns the
// count and the SHA-256 over the documents' bytes in that order.
func walk(ctx context.Context, coll *mongo.Collection, fn func(bson.Raw) error) (int64, string, error) {
	cur, err := coll.Find(ctx, bson.D{}, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		return 0, "", fmt.Errorf("read %s: %w", coll.Name(), err)
	}
	defer cur.Close(context.WithoutCancel(ctx))
	h := sha256.New()
	var n int64
	for cur.Next(ctx) {
		h.Write(cur.Current)
		n++
		if fn != nil {
			if err := fn(cur.Current); err != nil {
				return 0, "", err
			}
		}
	}
	if err := cur.Err(); err != nil {
		return 0, "", fmt.Errorf("read %s: %w", coll.Name(), err)
	}
	return n, "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// Backup implements Engine. The figures are computed from the very bytes
// written, so they describe the archive even while the database changes
// (the archive is consistent per document, not across collections).
func (m *MongoDB) Backup(ctx context.Context, dbName string, w io.Writer) (Figures, error) {
	c, err := m.client(ctx)
	if err != nil {
		return Figures{}, err
	}
	defer c.Disconnect(context.WithoutCancel(ctx)) //nolint:errcheck // read only
	db := c.Database(dbName)
	names, err := collections(ctx, db)
	if err != nil {
		return Figures{}, err
	}
	bw := bufio.NewWriterSize(w, 256<<10)
	if _, err := bw.WriteString(MongoMagic); err != nil {
		return Figures{}, err
	}
	fig := Figures{Kind: KindMongoDB, Items: []Item{}}
	var total int64
	for _, name := range names {
		coll := db.Collection(name)
		idx, err := indexSpecs(ctx, coll)
		if err != nil {
			return Figures{}, err
		}
		if err := writeRecord(bw, mongoTagCollection, bson.D{{Key: "name", Value: name}, {Key: "indexes", Value: idx}}); err != nil {
			return Figures{}, err
		}
		n, digest, err := walk(ctx, coll, func(doc bson.Raw) error {
			if err := bw.WriteByte(mongoTagDocument); err != nil {
				return err
			}
			_, err := bw.Write(doc)
			return err
		})
		if err != nil {
			return Figures{}, err
		}
		total += n
		fig.Items = append(fig.Items, Item{Name: name, Count: n, Digest: digest})
	}
	if err := writeRecord(bw, mongoTagEnd, bson.D{{Key: "collections", Value: int64(len(names))}, {Key: "documents", Value: total}}); err != nil {
		return Figures{}, err
	}
	return fig, bw.Flush()
}

func indexSpecs(ctx context.Context, coll *mongo.Collection) (bson.A, error) {
	cur, err := coll.Indexes().List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list indexes of %s: %w", coll.Name(), err)
	}
	defer cur.Close(context.WithoutCancel(ctx))
	out := bson.A{}
	for cur.Next(ctx) {
		out = append(out, bson.Raw(append([]byte(nil), cur.Current...)))
	}
	if err := cur.Err(); err != nil {
		return nil, fmt.Errorf("list indexes of %s: %w", coll.Name(), err)
	}
	return out, nil
}

func writeRecord(w *bufio.Writer, tag byte, doc bson.D) error {
	b, err := bson.Marshal(doc)
	if err != nil {
		return err
	}
	if err := w.WriteByte(tag); err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// Restore implements Engine: for each collection it (with Clean, drops it
// first) creates it, creates its indexes and inserts its documents in
// batches. The target database may be new.
func (m *MongoDB) Restore(ctx context.Context, dbName string, r io.Reader, opt RestoreOptions) error {
	br := bufio.NewReaderSize(r, 256<<10)
	magic := make([]byte, len(MongoMagic))
	if _, err := io.ReadFull(br, magic); err != nil || string(magic) != MongoMagic {
		if err == nil && strings.HasPrefix(string(magic), "BERTHMG") {
			return fmt.Errorf("mongodb archive version %q: %w", magic, ErrVersionMismatch)
		}
		return fmt.Errorf("mongodb archive header: %w", ErrArchiveInvalid)
	}
	c, err := m.client(ctx)
	if err != nil {
		return err
	}
	defer c.Disconnect(context.WithoutCancel(ctx)) //nolint:errcheck // best effort
	db := c.Database(dbName)
	var (
		coll    *mongo.Collection
		batch   []any
		size    int
		docs    int64
		nColls  int64
		flushFn = func() error {
			if len(batch) == 0 {
				return nil
			}
			if _, err := coll.InsertMany(ctx, batch); err != nil {
				return fmt.Errorf("insert into %s: %w", coll.Name(), err)
			}
			batch, size = batch[:0], 0
			return nil
		}
	)
	for {
		tag, err := br.ReadByte()
		if err != nil {
			return fmt.Errorf("mongodb archive ends before its end record: %w", ErrArchiveInvalid)
		}
		doc, err := bson.ReadDocument(br)
		if err != nil {
			return fmt.Errorf("mongodb archive record: %w: %w", ErrArchiveInvalid, err)
		}
		switch tag {
		case mongoTagCollection:
			if err := flushFn(); err != nil {
				return err
			}
			name, ok := doc.Lookup("name").StringValueOK()
			if !ok || name == "" {
				return fmt.Errorf("mongodb archive collection record without a name: %w", ErrArchiveInvalid)
			}
			coll = db.Collection(name)
			nColls++
			if opt.Clean {
				if err := coll.Drop(ctx); err != nil {
					return fmt.Errorf("drop %s: %w", name, err)
				}
			}
			if err := db.CreateCollection(ctx, name); err != nil {
				return fmt.Errorf("create collection %s: %w", name, err)
			}
			if err := createIndexes(ctx, coll, doc.Lookup("indexes")); err != nil {
				return err
			}
		case mongoTagDocument:
			if coll == nil {
				return fmt.Errorf("mongodb archive document before any collection: %w", ErrArchiveInvalid)
			}
			batch = append(batch, doc)
			size += len(doc)
			docs++
			if len(batch) >= mongoBatchDocs || size >= mongoBatchBytes {
				if err := flushFn(); err != nil {
					return err
				}
			}
		case mongoTagEnd:
			if err := flushFn(); err != nil {
				return err
			}
			wantC, _ := doc.Lookup("collections").AsInt64OK()
			wantD, _ := doc.Lookup("documents").AsInt64OK()
			if wantC != nColls || wantD != docs {
				return fmt.Errorf("mongodb archive end record says %d collections and %d documents, read %d and %d: %w", wantC, wantD, nColls, docs, ErrArchiveInvalid)
			}
			return nil
		default:
			return fmt.Errorf("mongodb archive record tag %q: %w", tag, ErrArchiveInvalid)
		}
	}
}

// createIndexes recreates the secondary indexes of a specification array
// (name, key, unique, sparse, expireAfterSeconds, partialFilterExpression).
func createIndexes(ctx context.Context, coll *mongo.Collection, specs bson.RawValue) error {
	arr, ok := specs.ArrayOK()
	if !ok {
		return nil
	}
	vals, err := arr.Values()
	if err != nil {
		return fmt.Errorf("index specifications of %s: %w: %w", coll.Name(), ErrArchiveInvalid, err)
	}
	var models []mongo.IndexModel
	for _, v := range vals {
		spec, ok := v.DocumentOK()
		if !ok {
			continue
		}
		name, _ := spec.Lookup("name").StringValueOK()
		if name == "_id_" {
			continue
		}
		key, ok := spec.Lookup("key").DocumentOK()
		if !ok {
			return fmt.Errorf("index %s of %s has no key: %w", name, coll.Name(), ErrArchiveInvalid)
		}
		o := options.Index().SetName(name)
		if u, ok := spec.Lookup("unique").BooleanOK(); ok && u {
			o.SetUnique(true)
		}
		if s, ok := spec.Lookup("sparse").BooleanOK(); ok && s {
			o.SetSparse(true)
		}
		if e, ok := spec.Lookup("expireAfterSeconds").AsInt64OK(); ok {
			o.SetExpireAfterSeconds(int32(e))
		}
		if p, ok := spec.Lookup("partialFilterExpression").DocumentOK(); ok {
			o.SetPartialFilterExpression(p)
		}
		models = append(models, mongo.IndexModel{Keys: key, Options: o})
	}
	if len(models) == 0 {
		return nil
	}
	if _, err := coll.Indexes().CreateMany(ctx, models); err != nil {
		return fmt.Errorf("create indexes of %s: %w", coll.Name(), err)
	}
	return nil
}

// Measure implements Engine.
func (m *MongoDB) Measure(ctx context.Context, dbName string) (Figures, error) {
	c, err := m.client(ctx)
	if err != nil {
		return Figures{}, err
	}
	defer c.Disconnect(context.WithoutCancel(ctx)) //nolint:errcheck // read only
	db := c.Database(dbName)
	names, err := collections(ctx, db)
	if err != nil {
		return Figures{}, err
	}
	fig := Figures{Kind: KindMongoDB, Items: []Item{}}
	for _, name := range names {
		n, digest, err := walk(ctx, db.Collection(name), nil)
		if err != nil {
			return Figures{}, err
		}
		fig.Items = append(fig.Items, Item{Name: name, Count: n, Digest: digest})
	}
	return fig, nil
}

// Create implements Engine. MongoDB makes a database with its first
// collection, so Create only checks that none of that name holds any.
func (m *MongoDB) Create(ctx context.Context, dbName string) error {
	c, err := m.client(ctx)
	if err != nil {
		return err
	}
	defer c.Disconnect(context.WithoutCancel(ctx)) //nolint:errcheck // read only
	names, err := collections(ctx, c.Database(dbName))
	if err != nil {
		return err
	}
	if len(names) > 0 {
		return fmt.Errorf("mongodb database %s: %w", dbName, ErrExists)
	}
	return nil
}

// Drop implements Engine.
func (m *MongoDB) Drop(ctx context.Context, dbName string) error {
	c, err := m.client(ctx)
	if err != nil {
		return err
	}
	defer c.Disconnect(context.WithoutCancel(ctx)) //nolint:errcheck // best effort
	if err := c.Database(dbName).Drop(ctx); err != nil {
		return fmt.Errorf("drop mongodb database %s: %w", dbName, err)
	}
	return nil
}
