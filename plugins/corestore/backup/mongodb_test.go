package backup_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/berthhq/berth/plugins/corestore/backup"
)

func mongoClient(t *testing.T) *mongo.Client {
	t.Helper()
	c, err := mongo.Connect(options.Client().ApplyURI(ferret.URI()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Disconnect(context.Background()) })
	return c
}

// seedApp makes database db with two collections: users (a unique index on
// email, mixed value types) and events (500 documents).
func seedApp(t *testing.T, ctx context.Context, db string) {
	t.Helper()
	c := mongoClient(t)
	t.Cleanup(func() { _ = c.Database(db).Drop(context.Background()) })
	users := c.Database(db).Collection("users")
	if _, err := users.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: bson.D{{Key: "email", Value: 1}}, Options: options.Index().SetName("email_1").SetUnique(true)}); err != nil {
		t.Fatal(err)
	}
	var docs []any
	for i := range 50 {
		docs = append(docs, bson.D{{Key: "_id", Value: fmt.Sprintf("u%03d", i)}, {Key: "email", Value: fmt.Sprintf("user%03d@example.com", i)},
			{Key: "age", Value: int32(20 + i)}, {Key: "score", Value: float64(i) / 3}, {Key: "tags", Value: bson.A{"a", int64(i)}},
			{Key: "profile", Value: bson.D{{Key: "city", Value: "needle-" + fmt.Sprint(i)}}}})
	}
	if _, err := users.InsertMany(ctx, docs); err != nil {
		t.Fatal(err)
	}
	docs = docs[:0]
	for i := range 500 {
		docs = append(docs, bson.D{{Key: "_id", Value: int64(i)}, {Key: "kind", Value: "click"}, {Key: "n", Value: int32(i)}})
	}
	if _, err := c.Database(db).Collection("events").InsertMany(ctx, docs); err != nil {
		t.Fatal(err)
	}
}

// TestMongoBackupRestore archives a database through the driver, restores
// it into a new database, and checks figures, documents and the unique
// index; then restores over the live database after documents were lost.
func TestMongoBackupRestore(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	seedApp(t, ctx, "app")
	e := &backup.MongoDB{URI: ferret.URI()}
	var archive bytes.Buffer
	fig, err := e.Backup(ctx, "app", &archive)
	if err != nil {
		t.Fatal(err)
	}
	if len(fig.Items) != 2 || fig.Items[0].Name != "events" || fig.Items[0].Count != 500 || fig.Items[1].Name != "users" || fig.Items[1].Count != 50 {
		t.Fatalf("figures %+v", fig.Items)
	}
	if err := e.Create(ctx, "app_copy"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Drop(context.Background(), "app_copy") })
	if err := e.Restore(ctx, "app_copy", bytes.NewReader(archive.Bytes()), backup.RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := e.Measure(ctx, "app_copy")
	if err != nil {
		t.Fatal(err)
	}
	if d := backup.Compare(fig, got); len(d) != 0 {
		t.Fatalf("restored copy differs: %v", d)
	}
	if err := e.Create(ctx, "app_copy"); !errors.Is(err, backup.ErrExists) {
		t.Errorf("Create of a database with collections: %v, want ErrExists", err)
	}
	users := mongoClient(t).Database("app_copy").Collection("users")
	var u bson.M
	if err := users.FindOne(ctx, bson.M{"_id": "u007"}).Decode(&u); err != nil || u["email"] != "user007@example.com" || u["age"] != int32(27) {
		t.Fatalf("u007 = %v, %v", u, err)
	}
	_, err = users.InsertOne(ctx, bson.M{"_id": "dup", "email": "user007@example.com"})
	if !mongo.IsDuplicateKeyError(err) {
		t.Fatalf("insert of a duplicate email into the restored collection: %v; the unique index did not come back", err)
	}

	live := mongoClient(t).Database("app")
	if _, err := live.Collection("events").DeleteMany(ctx, bson.M{"n": bson.M{"$gte": 100}}); err != nil {
		t.Fatal(err)
	}
	if err := e.Restore(ctx, "app", bytes.NewReader(archive.Bytes()), backup.RestoreOptions{Clean: true}); err != nil {
		t.Fatal(err)
	}
	back, err := e.Measure(ctx, "app")
	if err != nil {
		t.Fatal(err)
	}
	if d := backup.Compare(fig, back); len(d) != 0 {
		t.Fatalf("live database after restore differs: %v", d)
	}
}

// TestMongoRestoreRefusesDamagedArchive restores truncated archives and one
// with another magic.
func TestMongoRestoreRefusesDamagedArchive(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	seedApp(t, ctx, "appt")
	e := &backup.MongoDB{URI: ferret.URI()}
	var archive bytes.Buffer
	if _, err := e.Backup(ctx, "appt", &archive); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Drop(context.Background(), "appt_target") })
	b := archive.Bytes()
	for name, in := range map[string][]byte{
		"half":         b[:len(b)/2],
		"without end":  b[:bytes.LastIndexByte(b, 'E')],
		"no archive":   []byte("hello"),
		"empty stream": nil,
	} {
		if err := e.Restore(ctx, "appt_target", bytes.NewReader(in), backup.RestoreOptions{Clean: true}); !errors.Is(err, backup.ErrArchiveInvalid) {
			t.Errorf("%s: %v, want ErrArchiveInvalid", name, err)
		}
	}
	v2 := append([]byte("BERTHMG2"), b[len(backup.MongoMagic):]...)
	if err := e.Restore(ctx, "appt_target", bytes.NewReader(v2), backup.RestoreOptions{}); !errors.Is(err, backup.ErrVersionMismatch) {
		t.Errorf("version 2 archive: %v, want ErrVersionMismatch", err)
	}
}

// TestMongoDrill passes on a good archive and fails naming users when one
// document's value was altered on its way to storage.
func TestMongoDrill(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	seedApp(t, ctx, "appd")
	e := &backup.MongoDB{URI: ferret.URI()}
	var archive bytes.Buffer
	fig, err := e.Backup(ctx, "appd", &archive)
	if err != nil {
		t.Fatal(err)
	}
	res, err := backup.Drill(ctx, e, bytes.NewReader(archive.Bytes()), fig, "appd_scratch")
	if err != nil || !res.Passed || !res.Dropped {
		t.Fatalf("drill of a good archive: %+v, %v", res, err)
	}
	bad := corrupt(t, archive.Bytes(), "needle-17\x00", "needlE-17\x00")
	res, err = backup.Drill(ctx, e, bytes.NewReader(bad), fig, "appd_scratch")
	if err != nil {
		t.Fatal(err)
	}
	if res.Passed || res.Error != "" || len(res.Differences) != 1 || res.Differences[0].Name != "users" {
		t.Fatalf("drill of a corrupted archive: %+v; want failed on users", res)
	}
	names, err := mongoClient(t).Database("appd_scratch").ListCollectionNames(ctx, bson.D{})
	if err != nil || len(names) != 0 {
		t.Fatalf("scratch database holds %v, %v after the drill", names, err)
	}
}
