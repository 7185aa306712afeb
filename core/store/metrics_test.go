package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/berthhq/berth/core/store"
)

// storeOps returns the value of berth_store_operations_total{command,collection,outcome} and the
// sample count of the latency histogram for command and collection.
func storeOps(t *testing.T, reg *prometheus.Registry, command, collection, outcome string) (float64, uint64) {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var ops float64
	var observed uint64
	match := func(m *dto.Metric, withOutcome bool) bool {
		want := map[string]string{"command": command, "collection": collection}
		if withOutcome {
			want["outcome"] = outcome
		}
		n := 0
		for _, l := range m.GetLabel() {
			if v, ok := want[l.GetName()]; ok {
				if v != l.GetValue() {
					return false
				}
				n++
			}
		}
		return n == len(want)
	}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			switch f.GetName() {
			case "berth_store_operations_total":
				if match(m, true) {
					ops += m.GetCounter().GetValue()
				}
			case "berth_store_operation_duration_seconds":
				if match(m, false) {
					observed += m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return ops, observed
}

func TestStoreCountsCommandsByCollectionAndOutcome(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	unlock, err := store.LockDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unlock() })
	reg := prometheus.NewRegistry()
	s, err := store.Open(ctx, store.Config{DataDir: dir, Logger: testLogger(t), Metrics: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })

	c := s.Collection("things")
	if _, err := c.InsertOne(ctx, bson.D{{Key: "_id", Value: "a"}}); err != nil {
		t.Fatal(err)
	}
	// A duplicate _id succeeds as a command but carries a write error.
	if _, err := c.InsertOne(ctx, bson.D{{Key: "_id", Value: "a"}}); err == nil {
		t.Fatal("second insert of _id a succeeded")
	}
	// An unknown command fails as a command; its name is counted as "other".
	if err := s.DB().RunCommand(ctx, bson.D{{Key: "noSuchCommand", Value: "things"}}).Err(); err == nil {
		t.Fatal("unknown command succeeded")
	}
	if err := c.FindOne(ctx, bson.D{{Key: "_id", Value: "a"}}).Err(); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		command, outcome string
		want             float64
	}{
		{"insert", "ok", 1},
		{"insert", "error", 1},
		{"other", "error", 1},
		{"find", "ok", 1},
	} {
		got, observed := storeOps(t, reg, tc.command, "things", tc.outcome)
		if got != tc.want {
			t.Errorf("berth_store_operations_total{command=%q,collection=things,outcome=%q} = %v, want %v", tc.command, tc.outcome, got, tc.want)
		}
		if observed == 0 {
			t.Errorf("berth_store_operation_duration_seconds{command=%q,collection=things} has no samples", tc.command)
		}
	}
}
