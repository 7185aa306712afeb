package ui

import (
	"context"
	"net/http"

	"github.com/berthhq/berth/sdk/client"
)

// The plugins page (docs/ui.md section 1): the plugin processes berthd supervises (GET
// /plugins) with their state and health, and for admins the WebAssembly modules (GET /modules),
// their bindings (GET /policy-bindings) and the newest policy decisions (GET
// /policy-decisions). A binding's config is not shown: it is handed to the module unchanged
// and may hold what a page must not show.

// policyDecisionRows is how many of the newest policy decisions the plugins page shows.
const policyDecisionRows = 20

// pluginsData is what the plugins page shows. PluginsNote and ModulesNote hold why a part is
// missing: the API's refusal (modules are an admin's), or that policies are not enabled.
type pluginsData struct {
	Plugins     []client.Plugin
	PluginsNote string
	Modules     []client.Module
	Bindings    []client.Binding
	Decisions   []client.PolicyDecision
	ModulesNote string
}

// loadPlugins reads the plugins, modules, bindings and newest decisions through the API.
func loadPlugins(ctx context.Context, c *client.Client) (*pluginsData, error) {
	d := &pluginsData{}
	var err error
	if d.Plugins, err = c.ListPlugins(ctx); client.IsCode(err, "forbidden") {
		d.PluginsNote = errText(err)
	} else if err != nil {
		return nil, err
	}
	d.Modules, err = c.Modules(ctx)
	if err == nil {
		d.Bindings, err = c.Bindings(ctx)
	}
	if err == nil {
		d.Decisions, err = c.PolicyDecisions(ctx, policyDecisionRows)
	}
	switch {
	case client.IsCode(err, "forbidden"), client.IsCode(err, "unavailable"), apiStatus(err) == http.StatusNotFound:
		d.Modules, d.Bindings, d.Decisions, d.ModulesNote = nil, nil, nil, errText(err)
	case err != nil:
		return nil, err
	}
	return d, nil
}

func (h *Handler) pluginsPage(w http.ResponseWriter, r *http.Request, v *viewer) {
	h.page(w, r, v, "plugins", "Plugins and modules", nil)
}
