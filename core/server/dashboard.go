package server

import (
	"net/http"

	"github.com/berthhq/berth/core/ui"
)

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
