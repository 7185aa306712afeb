package api

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/berthhq/berth/host/plugin"
	"github.com/berthhq/berth/sdk/client"
)

// PluginLister reports the plugin processes berthd supervises.
type PluginLister func() []plugin.Status

// listPlugins serves GET /api/v1/plugins.
func (s *Server) listPlugins(c echo.Context) error {
	out := client.List[client.Plugin]{Items: []client.Plugin{}}
	if s.cfg.Plugins != nil {
		for _, p := range s.cfg.Plugins() {
			out.Items = append(out.Items, client.Plugin{
				Name: p.Name, Kind: string(p.Kind), Path: p.Path, Version: p.Version, APIVersion: p.APIVersion,
				State: string(p.State), PID: p.PID, Launches: p.Launches, Crashes: p.Crashes,
				Health: string(p.Health), HealthDescription: p.HealthDescription,
				Degraded: p.Degraded, DegradedReason: p.DegradedReason, LastError: p.LastError,
			})
		}
	}
	return c.JSON(http.StatusOK, out)
}
