package provider

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	providerv1 "github.com/berthhq/berth/abi/proto/provider/v1"
	"github.com/berthhq/berth/abi/routes"
)

// gatewayServer serves a Gateway as the Gateway gRPC service.
type gatewayServer struct {
	providerv1.UnimplementedGatewayServer
	impl Gateway
}

func (s *gatewayServer) Describe(ctx context.Context, _ *providerv1.DescribeRequest) (*providerv1.DescribeResponse, error) {
	r, err := s.impl.Describe(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	if r == nil {
		return nil, status.Error(codes.Internal, "gateway: Describe returned no response")
	}
	out := &providerv1.DescribeResponse{Name: r.Name, Version: r.Version, Capabilities: r.Capabilities}
	for _, v := range r.APIVersions {
		out.ApiVersions = append(out.ApiVersions, int32(v))
	}
	return out, nil
}

func (s *gatewayServer) SetRoutes(ctx context.Context, req *providerv1.SetRoutesRequest) (*providerv1.SetRoutesResponse, error) {
	if err := s.impl.SetRoutes(ctx, TableFromProto(req.GetTable())); err != nil {
		return nil, toStatus(err)
	}
	return &providerv1.SetRoutesResponse{}, nil
}

// GatewayGRPCClient is the host side of a gateway plugin: it implements Gateway
// over the Gateway gRPC service. Every call runs under the caller's ctx joined
// with the plugin's lifetime, so calls in flight fail at once when the plugin
// process exits. Safe for concurrent use.
type GatewayGRPCClient struct {
	life   context.Context
	client providerv1.GatewayClient
}

var _ Gateway = (*GatewayGRPCClient)(nil)

// NewGatewayGRPCClient returns a client over conn. life is the plugin's
// lifetime context (go-plugin cancels it when the process exits); nil means none.
func NewGatewayGRPCClient(life context.Context, conn grpc.ClientConnInterface) *GatewayGRPCClient {
	if life == nil {
		life = context.Background()
	}
	return &GatewayGRPCClient{life: life, client: providerv1.NewGatewayClient(conn)}
}

// Done returns a channel closed when the plugin process has exited.
func (c *GatewayGRPCClient) Done() <-chan struct{} { return c.life.Done() }

var errPluginExited = errors.New("berth: gateway plugin exited")

func (c *GatewayGRPCClient) join(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(c.life, func() { cancel(errPluginExited) })
	return ctx, func() { stop(); cancel(context.Canceled) }
}

// Describe implements Gateway.
func (c *GatewayGRPCClient) Describe(ctx context.Context) (*DescribeResponse, error) {
	ctx, cancel := c.join(ctx)
	defer cancel()
	r, err := c.client.Describe(ctx, &providerv1.DescribeRequest{})
	if err != nil {
		return nil, fromStatus(ctx, "describe", err)
	}
	out := &DescribeResponse{Name: r.GetName(), Version: r.GetVersion(), Capabilities: r.GetCapabilities()}
	for _, v := range r.GetApiVersions() {
		out.APIVersions = append(out.APIVersions, int(v))
	}
	return out, nil
}

// SetRoutes implements Gateway.
func (c *GatewayGRPCClient) SetRoutes(ctx context.Context, t routes.Table) error {
	ctx, cancel := c.join(ctx)
	defer cancel()
	if _, err := c.client.SetRoutes(ctx, &providerv1.SetRoutesRequest{Table: TableToProto(t)}); err != nil {
		return fromStatus(ctx, fmt.Sprintf("set routes (revision %d)", t.Revision), err)
	}
	return nil
}

// TableToProto converts a route table to its wire form.
func TableToProto(t routes.Table) *providerv1.RouteTable {
	out := &providerv1.RouteTable{Revision: t.Revision, Routes: make([]*providerv1.Route, 0, len(t.Routes))}
	for _, r := range t.Routes {
		pr := &providerv1.Route{Hostname: r.Hostname, Project: r.Project, Service: r.Service}
		for _, u := range r.Upstreams {
			pr.Upstreams = append(pr.Upstreams, &providerv1.Upstream{WorkloadId: u.WorkloadID, Address: u.Address, Healthy: u.Healthy})
		}
		out.Routes = append(out.Routes, pr)
	}
	return out
}

// TableFromProto converts a wire route table back; nil gives the empty table.
func TableFromProto(t *providerv1.RouteTable) routes.Table {
	out := routes.Table{Revision: t.GetRevision()}
	for _, r := range t.GetRoutes() {
		rr := routes.Route{Hostname: r.GetHostname(), Project: r.GetProject(), Service: r.GetService()}
		for _, u := range r.GetUpstreams() {
			rr.Upstreams = append(rr.Upstreams, routes.Upstream{WorkloadID: u.GetWorkloadId(), Address: u.GetAddress(), Healthy: u.GetHealthy()})
		}
		out.Routes = append(out.Routes, rr)
	}
	return out
}

// RemoteError is an error returned by a plugin, carried over gRPC. Error is
// the plugin's message; Unwrap returns the context error its gRPC code maps
// to, or nil.
type RemoteError struct {
	Code     codes.Code
	Message  string
	sentinel error
}

// Error returns the plugin's message.
func (e *RemoteError) Error() string { return e.Message }

// Unwrap returns the sentinel the gRPC code maps to, or nil.
func (e *RemoteError) Unwrap() error { return e.sentinel }

// GRPCStatus lets status.FromError recover the code.
func (e *RemoteError) GRPCStatus() *status.Status { return status.New(e.Code, e.Message) }

func toStatus(err error) error {
	switch {
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	return status.Error(codes.Unknown, err.Error())
}

func fromStatus(ctx context.Context, what string, err error) error {
	if cause := context.Cause(ctx); cause != nil {
		return fmt.Errorf("gateway: %s: %w", what, cause)
	}
	st, ok := status.FromError(err)
	if !ok {
		return fmt.Errorf("gateway: %s: %w", what, err)
	}
	re := &RemoteError{Code: st.Code(), Message: st.Message()}
	switch st.Code() {
	case codes.Canceled:
		re.sentinel = context.Canceled
	case codes.DeadlineExceeded:
		re.sentinel = context.DeadlineExceeded
	}
	return fmt.Errorf("gateway: %s: %w", what, re)
}
