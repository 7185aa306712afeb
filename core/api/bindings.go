package api

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/labstack/echo/v4"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/core/bindings"
	"github.com/berthhq/berth/core/identity"
	"github.com/berthhq/berth/core/store"
	client "github.com/berthhq/berth/sdk/client"
)

// registerBindings adds the binding routes (docs/api.md section 11). Without bindings
// configured they answer 503 unavailable, saying that this berthd runs no corestore provider.
func (s *Server) registerBindings(v1 *echo.Group) {
	list, del := s.listServiceBindings, s.deleteBinding
	if s.cfg.Bindings == nil {
		list, del = noCorestore, noCorestore
	}
	v1.GET("/projects/:project/bindings", list, s.auth(identity.ScopeServicesRead))
	v1.DELETE("/projects/:project/services/:name/bindings/:binding", del, s.auth(identity.ScopeServicesWrite))
}

// noCorestore answers the binding routes of a berthd without bindings.
func noCorestore(echo.Context) error {
	return problem(abierrors.Unavailable, "this berthd runs no corestore provider, so no service has bindings (berthd --corestore-config; docs/bindings.md section 5)")
}

func toAPIBinding(b *bindings.Binding) client.ServiceBinding {
	out := client.ServiceBinding{Service: b.Service, Name: b.Name, Kind: b.Kind, Generation: b.Generation, State: b.State,
		Endpoint: b.Endpoint, Database: b.Database, User: b.User, Users: b.Users, LastError: b.LastError,
		OperationID: b.OperationID, UpdatedAt: b.UpdatedAt}
	if len(b.Secrets) > 0 {
		out.Secrets = map[string]string{}
		for env, r := range b.Secrets {
			out.Secrets[env] = r.Secret
		}
	}
	return out
}

// listServiceBindings answers GET /projects/{p}/bindings[?service=NAME]: every binding with its state,
// endpoint and the reason of its last failure; never a credential.
func (s *Server) listServiceBindings(c echo.Context) error {
	p, err := s.project(c, false)
	if err != nil {
		return err
	}
	svc := c.QueryParam("service")
	if svc != "" {
		if err := checkName("service", svc); err != nil {
			return err
		}
	}
	all, err := s.cfg.Bindings.List(c.Request().Context(), p.ID, svc)
	if err != nil {
		return err
	}
	out := client.List[client.ServiceBinding]{Items: []client.ServiceBinding{}}
	for i := range all {
		out.Items = append(out.Items, toAPIBinding(&all[i]))
	}
	return c.JSON(http.StatusOK, out)
}

// deleteBinding answers DELETE /projects/{p}/services/{s}/bindings/{b}[?purge=true]. Without
// purge the binding is released and its data kept (409 binding_in_use while the service still
// declares it); with purge an operation fenced by the project's sequence drops the data. 202
// with the binding; the operation is in GET /projects/{p}/operations.
func (s *Server) deleteBinding(c echo.Context) error {
	if err := checkName("service", c.Param("name")); err != nil {
		return err
	}
	p, err := s.project(c, false)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	purge := c.QueryParam("purge") == "true"
	b, err := s.cfg.Bindings.Get(ctx, p.ID, c.Param("name"), c.Param("binding"))
	if errors.Is(err, store.ErrNotFound) {
		return problem(abierrors.NotFound, fmt.Sprintf("service %q has no binding %q", c.Param("name"), c.Param("binding")))
	} else if err != nil {
		return err
	}
	if svc, err := s.cfg.Catalog.GetService(ctx, p, b.Service); err == nil {
		for _, spec := range svc.Bindings {
			if spec.Name == b.Name {
				return problem(abierrors.Conflict, fmt.Sprintf("service %q still declares binding %q: remove it from the service's bindings first", b.Service, b.Name))
			}
		}
	}
	if purge {
		if b, err = s.cfg.Bindings.Purge(ctx, p.ID, b.Service, b.Name); err != nil {
			return err
		}
	} else if b.State != bindings.StateReleased && b.State != bindings.StatePurged {
		if err := s.cfg.Bindings.Release(ctx, b); err != nil {
			return err
		}
	}
	if b, err = s.cfg.Bindings.Get(ctx, p.ID, b.Service, b.Name); err != nil {
		return err
	}
	return c.JSON(http.StatusAccepted, toAPIBinding(b))
}
