package pgtest_test

import (
	"context"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/jackc/pgx/v5"

	"github.com/berthhq/berth/internal/ferrettest"
	"github.com/berthhq/berth/internal/pgtest"
	"github.com/berthhq/berth/internal/proctest"
)

// TestPostgresAndFerretDBOnIt starts PostgreSQL, checks a password login
// and a wrong password's refusal, then runs FerretDB on a database of it
// and writes and reads one document through the MongoDB driver.
func TestPostgresAndFerretDBOnIt(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pg := pgtest.Start(t)
	conn, err := pgx.Connect(ctx, pg.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	var v string
	if err := conn.QueryRow(ctx, "SHOW server_version_num").Scan(&v); err != nil || v[:2] != "15" {
		t.Fatalf("server_version_num = %q, %v; want 15xxxx", v, err)
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE ferretdb"); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	bad := pg.URL("postgres")
	if c, err := pgx.Connect(ctx, bad[:len("postgres://postgres:")]+"wrong"+bad[len("postgres://postgres:")+len(pg.Password):]); err == nil {
		c.Close(ctx)
		t.Fatal("a wrong password connected")
	}

	bin, err := ferrettest.Build(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	f, err := ferrettest.StartPostgres(bin, proctest.FreeAddr(t), pg.URL("ferretdb"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Stop()
	mc, err := mongo.Connect(options.Client().ApplyURI(f.URI()))
	if err != nil {
		t.Fatal(err)
	}
	defer mc.Disconnect(ctx)
	coll := mc.Database("app").Collection("things")
	if _, err := coll.InsertOne(ctx, bson.M{"_id": "a", "n": 1}); err != nil {
		t.Fatal(err)
	}
	var got bson.M
	if err := coll.FindOne(ctx, bson.M{"_id": "a"}).Decode(&got); err != nil || got["n"] != int32(1) {
		t.Fatalf("read back %v, %v", got, err)
	}
}
