package storetest_test

import (
	"context"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/core/store"
	"github.com/berthhq/berth/core/store/storetest"
)

func TestSharedURI(t *testing.T) {
	st := storetest.Open(t)
	uri := storetest.SharedURI(t, st)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	other, err := store.Open(ctx, store.Config{URI: uri, Database: st.DB().Name()})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(context.Background())
	if _, err := other.Collection("x").InsertOne(ctx, bson.M{"_id": 1}); err != nil {
		t.Fatal(err)
	}
	if n, err := st.Collection("x").CountDocuments(ctx, bson.M{}); err != nil || n != 1 {
		t.Fatalf("count %d %v", n, err)
	}
}
