package provider

import (
	"context"
	"encoding/json"
	"time"

	"google.golang.org/grpc"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/pluginapi"
	pluginv1 "github.com/berthhq/berth/abi/proto/plugin/v1"
	providerv1 "github.com/berthhq/berth/abi/proto/provider/v1"
)

// server serves a Provider as the Provider gRPC service.
type server struct {
	providerv1.UnimplementedProviderServer
	impl Provider
}

// NewServer returns the Provider gRPC service backed by impl. Errors travel as
// described in [pluginapi.ToStatus]; Configure of a plugin without
// [Configurer] succeeds and does nothing.
func NewServer(impl Provider) providerv1.ProviderServer { return &server{impl: impl} }

func (s *server) Describe(ctx context.Context, _ *pluginv1.DescribeRequest) (*providerv1.DescribeResponse, error) {
	r, err := s.impl.Describe(ctx)
	if err != nil {
		return nil, pluginapi.ToStatus(err)
	}
	if r == nil {
		return nil, pluginapi.ToStatus(abierrors.New(abierrors.Internal, "Describe returned no response"))
	}
	out := &providerv1.DescribeResponse{Name: r.Name, Version: r.Version, Capabilities: &providerv1.Capabilities{DurableState: r.Capabilities.DurableState}}
	for _, v := range r.APIVersions {
		out.ApiVersions = append(out.ApiVersions, int32(v))
	}
	for _, t := range r.Capabilities.ResourceTypes {
		rt := &providerv1.ResourceType{Name: t.Name, Variants: t.Variants, ExampleId: t.ExampleID, Schema: t.Schema,
			DriftIntervalSeconds: uint32(max(t.DriftInterval, 0) / time.Second)}
		for _, a := range t.ExampleAttributes {
			rt.ExampleAttributes = append(rt.ExampleAttributes, a)
		}
		out.Capabilities.ResourceTypes = append(out.Capabilities.ResourceTypes, rt)
	}
	return out, nil
}

func (s *server) Health(_ *pluginv1.HealthRequest, stream grpc.ServerStreamingServer[pluginv1.HealthReport]) error {
	return pluginapi.ServeHealth(stream.Context(), s.impl, stream.Send)
}

func (s *server) ValidateConfig(ctx context.Context, req *pluginv1.ConfigRequest) (*pluginv1.ValidateConfigResponse, error) {
	r, err := s.impl.ValidateConfig(ctx, &ConfigRequest{Config: req.GetConfig(), APIVersion: int(req.GetApiVersion())})
	if err != nil {
		return nil, pluginapi.ToStatus(err)
	}
	if r == nil {
		return &pluginv1.ValidateConfigResponse{}, nil
	}
	return &pluginv1.ValidateConfigResponse{Problems: r.Problems}, nil
}

func (s *server) Configure(ctx context.Context, req *pluginv1.ConfigRequest) (*pluginv1.ConfigureResponse, error) {
	c, ok := s.impl.(Configurer)
	if !ok {
		return &pluginv1.ConfigureResponse{}, nil
	}
	if err := c.Configure(ctx, &ConfigRequest{Config: req.GetConfig(), APIVersion: int(req.GetApiVersion())}); err != nil {
		return nil, pluginapi.ToStatus(err)
	}
	return &pluginv1.ConfigureResponse{}, nil
}

func (s *server) Plan(ctx context.Context, req *providerv1.PlanRequest) (*providerv1.PlanResponse, error) {
	in := &PlanRequest{Desired: ResourceFromProto(req.GetDesired())}
	if req.GetCurrent() != nil {
		c := ResourceFromProto(req.GetCurrent())
		in.Current = &c
	}
	r, err := s.impl.Plan(ctx, in)
	if err != nil {
		return nil, pluginapi.ToStatus(err)
	}
	if r == nil {
		return nil, pluginapi.ToStatus(abierrors.New(abierrors.Internal, "Plan returned no response"))
	}
	return &providerv1.PlanResponse{Planned: ResourceToProto(r.Planned), Changes: r.Changes}, nil
}

func (s *server) Apply(ctx context.Context, req *providerv1.ApplyRequest) (*providerv1.ApplyResponse, error) {
	r, err := s.impl.Apply(ctx, &ApplyRequest{Planned: ResourceFromProto(req.GetPlanned()), Mutation: mutationFromProto(req.GetMutation())})
	if err != nil {
		return nil, pluginapi.ToStatus(err)
	}
	if r == nil {
		return nil, pluginapi.ToStatus(abierrors.New(abierrors.Internal, "Apply returned no response"))
	}
	return &providerv1.ApplyResponse{State: ResourceToProto(r.State), Credentials: r.Credentials}, nil
}

func (s *server) Read(ctx context.Context, req *providerv1.ReadRequest) (*providerv1.ReadResponse, error) {
	r, err := s.impl.Read(ctx, &ReadRequest{Type: req.GetType(), ID: req.GetId()})
	if err != nil {
		return nil, pluginapi.ToStatus(err)
	}
	if r == nil {
		return nil, pluginapi.ToStatus(abierrors.New(abierrors.Internal, "Read returned no response"))
	}
	return &providerv1.ReadResponse{State: ResourceToProto(r.State)}, nil
}

func (s *server) Delete(ctx context.Context, req *providerv1.DeleteRequest) (*providerv1.DeleteResponse, error) {
	if _, err := s.impl.Delete(ctx, &DeleteRequest{Type: req.GetType(), ID: req.GetId(), Purge: req.GetPurge(), Mutation: mutationFromProto(req.GetMutation())}); err != nil {
		return nil, pluginapi.ToStatus(err)
	}
	return &providerv1.DeleteResponse{}, nil
}

// Client is the host side of a provider plugin: it implements [Provider],
// [Configurer] and [pluginapi.HealthReporter] over the Provider gRPC service.
// Every call runs under the caller's ctx joined with the plugin's lifetime.
// Errors keep their stable code ([pluginapi.FromStatus]). Safe for
// concurrent use.
type Client struct {
	life   context.Context
	client providerv1.ProviderClient
}

var (
	_ Provider                 = (*Client)(nil)
	_ Configurer               = (*Client)(nil)
	_ pluginapi.HealthReporter = (*Client)(nil)
)

// NewClient returns a client over conn. life is the plugin process's
// lifetime (go-plugin cancels it when the process exits); nil means none.
func NewClient(life context.Context, conn grpc.ClientConnInterface) *Client {
	if life == nil {
		life = context.Background()
	}
	return &Client{life: life, client: providerv1.NewProviderClient(conn)}
}

// Done returns a channel closed when the plugin process has exited.
func (c *Client) Done() <-chan struct{} { return c.life.Done() }

const errPrefix = "provider: "

// Describe implements Provider.
func (c *Client) Describe(ctx context.Context) (*DescribeResponse, error) {
	ctx, cancel := pluginapi.Join(ctx, c.life)
	defer cancel()
	r, err := c.client.Describe(ctx, &pluginv1.DescribeRequest{})
	if err != nil {
		return nil, pluginapi.FromStatus(ctx, errPrefix+"describe", err)
	}
	out := &DescribeResponse{Name: r.GetName(), Version: r.GetVersion(), APIVersions: pluginapi.APIVersions(r.GetApiVersions())}
	if cp := r.GetCapabilities(); cp != nil {
		out.Capabilities.DurableState = cp.GetDurableState()
		for _, t := range cp.GetResourceTypes() {
			rt := ResourceType{Name: t.GetName(), Variants: t.GetVariants(), ExampleID: t.GetExampleId(),
				DriftInterval: time.Duration(t.GetDriftIntervalSeconds()) * time.Second}
			if len(t.GetSchema()) > 0 {
				rt.Schema = json.RawMessage(t.GetSchema())
			}
			for _, a := range t.GetExampleAttributes() {
				rt.ExampleAttributes = append(rt.ExampleAttributes, json.RawMessage(a))
			}
			out.Capabilities.ResourceTypes = append(out.Capabilities.ResourceTypes, rt)
		}
	}
	return out, nil
}

// Health implements pluginapi.HealthReporter. The channel is closed when ctx
// ends or the plugin exits.
func (c *Client) Health(ctx context.Context) (<-chan pluginapi.HealthReport, error) {
	return pluginapi.WatchHealth(ctx, c.life, errPrefix+"health", func(ctx context.Context) (pluginapi.HealthStream, error) {
		return c.client.Health(ctx, &pluginv1.HealthRequest{})
	})
}

// ValidateConfig implements Provider.
func (c *Client) ValidateConfig(ctx context.Context, req *ConfigRequest) (*ValidateConfigResponse, error) {
	ctx, cancel := pluginapi.Join(ctx, c.life)
	defer cancel()
	r, err := c.client.ValidateConfig(ctx, &pluginv1.ConfigRequest{Config: req.Config, ApiVersion: int32(req.APIVersion)})
	if err != nil {
		return nil, pluginapi.FromStatus(ctx, errPrefix+"validate config", err)
	}
	return &ValidateConfigResponse{Problems: r.GetProblems()}, nil
}

// Configure implements Configurer.
func (c *Client) Configure(ctx context.Context, req *ConfigRequest) error {
	ctx, cancel := pluginapi.Join(ctx, c.life)
	defer cancel()
	if _, err := c.client.Configure(ctx, &pluginv1.ConfigRequest{Config: req.Config, ApiVersion: int32(req.APIVersion)}); err != nil {
		return pluginapi.FromStatus(ctx, errPrefix+"configure", err)
	}
	return nil
}

// Plan implements Provider.
func (c *Client) Plan(ctx context.Context, req *PlanRequest) (*PlanResponse, error) {
	ctx, cancel := pluginapi.Join(ctx, c.life)
	defer cancel()
	in := &providerv1.PlanRequest{Desired: ResourceToProto(req.Desired)}
	if req.Current != nil {
		in.Current = ResourceToProto(*req.Current)
	}
	r, err := c.client.Plan(ctx, in)
	if err != nil {
		return nil, pluginapi.FromStatus(ctx, errPrefix+"plan "+req.Desired.Type+"/"+req.Desired.ID, err)
	}
	return &PlanResponse{Planned: ResourceFromProto(r.GetPlanned()), Changes: r.GetChanges()}, nil
}

// Apply implements Provider.
func (c *Client) Apply(ctx context.Context, req *ApplyRequest) (*ApplyResponse, error) {
	ctx, cancel := pluginapi.Join(ctx, c.life)
	defer cancel()
	r, err := c.client.Apply(ctx, &providerv1.ApplyRequest{Planned: ResourceToProto(req.Planned), Mutation: mutationToProto(req.Mutation)})
	if err != nil {
		return nil, pluginapi.FromStatus(ctx, errPrefix+"apply "+req.Planned.Type+"/"+req.Planned.ID, err)
	}
	return &ApplyResponse{State: ResourceFromProto(r.GetState()), Credentials: r.GetCredentials()}, nil
}

// Read implements Provider.
func (c *Client) Read(ctx context.Context, req *ReadRequest) (*ReadResponse, error) {
	ctx, cancel := pluginapi.Join(ctx, c.life)
	defer cancel()
	r, err := c.client.Read(ctx, &providerv1.ReadRequest{Type: req.Type, Id: req.ID})
	if err != nil {
		return nil, pluginapi.FromStatus(ctx, errPrefix+"read "+req.Type+"/"+req.ID, err)
	}
	return &ReadResponse{State: ResourceFromProto(r.GetState())}, nil
}

// Delete implements Provider.
func (c *Client) Delete(ctx context.Context, req *DeleteRequest) (*DeleteResponse, error) {
	ctx, cancel := pluginapi.Join(ctx, c.life)
	defer cancel()
	if _, err := c.client.Delete(ctx, &providerv1.DeleteRequest{Type: req.Type, Id: req.ID, Purge: req.Purge, Mutation: mutationToProto(req.Mutation)}); err != nil {
		return nil, pluginapi.FromStatus(ctx, errPrefix+"delete "+req.Type+"/"+req.ID, err)
	}
	return &DeleteResponse{}, nil
}

// ResourceToProto converts a resource to its wire form.
func ResourceToProto(r Resource) *providerv1.Resource {
	return &providerv1.Resource{Type: r.Type, Id: r.ID, Attributes: r.Attributes}
}

// ResourceFromProto converts a wire resource back; nil gives the zero Resource.
func ResourceFromProto(r *providerv1.Resource) Resource {
	return Resource{Type: r.GetType(), ID: r.GetId(), Attributes: r.GetAttributes()}
}

func mutationToProto(m pluginapi.Mutation) *pluginv1.Mutation {
	return &pluginv1.Mutation{OperationId: m.OperationID, IdempotencyKey: m.IdempotencyKey, FencingToken: m.FencingToken}
}

func mutationFromProto(m *pluginv1.Mutation) pluginapi.Mutation {
	return pluginapi.Mutation{OperationID: m.GetOperationId(), IdempotencyKey: m.GetIdempotencyKey(), FencingToken: m.GetFencingToken()}
}
