package jobs_test

import (
	"testing"
	"time"

	"github.com/berthhq/berth/core/jobs"
)

// BenchmarkNext measures one fire-time search of a daily wall-clock schedule in a zone with
// daylight saving, from instants spread over a year.
func BenchmarkNext(b *testing.B) {
	c, err := jobs.Schedule{Cron: "30 2 * * *", TimeZone: "Europe/Berlin"}.Compile()
	if err != nil {
		b.Fatal(err)
	}
	t0 := utc("2026-01-01T00:00:00Z")
	i := 0
	for b.Loop() {
		_ = c.Next(t0.Add(time.Duration(i%8760) * time.Hour))
		i++
	}
}
