package server

import (
	"net/http"

	"github.com/berthhq/berth/core/backups"
	"github.com/berthhq/berth/core/bindings"
	"github.com/berthhq/berth/core/dnsrecords"
	"github.com/berthhq/berth/core/jobs"
	"github.com/berthhq/berth/core/ui"
)

// dashboardCollections are the collections whose writes change what the dashboard's pages show:
// services and their rollouts, workloads and nodes, and the job runs (the overview's jobs of the
// last 24 hours), bindings and backups (the bindings and backups page) and DNS records (the
// domains page) the pages list too.
func dashboardCollections() []string {
	return []string{"services", "workloads", "slots", "runtime_status", "nodes", jobs.RunsCollection, bindings.Collection, backups.Collection,
		dnsrecords.Collection}
}

// withDashboard sends the dashboard's paths (/ui, /ui/...; docs/ui.md) to dash and every
// other path to api. The dashboard reaches the API in process through api itself.
func withDashboard(api, dash http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ui.Owns(r.URL.Path) {
			dash.ServeHTTP(w, r)
			return
		}
		api.ServeHTTP(w, r)
	})
}
