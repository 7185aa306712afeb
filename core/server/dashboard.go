package server

import (
	"net/http"

	"github.com/berthhq/berth/core/ui"
)

// dashboardCollections are the collections whose writes change what the dashboard's pages show.
func dashboardCollections() []string {
	return []string{"services", "workloads", "slots", "runtime_status", "nodes"}
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
