package network

import (
	"context"

	"google.golang.org/grpc"

	abierrors "github.com/berthhq/berth/abi/errors"
	"github.com/berthhq/berth/abi/pluginapi"
	networkv1 "github.com/berthhq/berth/abi/proto/network/v1"
	pluginv1 "github.com/berthhq/berth/abi/proto/plugin/v1"
)

// server serves a Network as the NodeNetwork gRPC service.
type server struct {
	networkv1.UnimplementedNodeNetworkServer
	impl Network
}

// NewServer returns the NodeNetwork gRPC service backed by impl. Errors
// travel as described in [pluginapi.ToStatus].
func NewServer(impl Network) networkv1.NodeNetworkServer { return &server{impl: impl} }

func (s *server) Describe(ctx context.Context, _ *pluginv1.DescribeRequest) (*networkv1.DescribeResponse, error) {
	r, err := s.impl.Describe(ctx)
	if err != nil {
		return nil, pluginapi.ToStatus(err)
	}
	if r == nil {
		return nil, pluginapi.ToStatus(abierrors.New(abierrors.Internal, "Describe returned no response"))
	}
	out := &networkv1.DescribeResponse{Name: r.Name, Version: r.Version}
	for _, v := range r.APIVersions {
		out.ApiVersions = append(out.ApiVersions, int32(v))
	}
	return out, nil
}

func (s *server) Health(_ *pluginv1.HealthRequest, stream grpc.ServerStreamingServer[pluginv1.HealthReport]) error {
	return pluginapi.ServeHealth(stream.Context(), s.impl, stream.Send)
}

func (s *server) Setup(ctx context.Context, req *networkv1.SetupRequest) (*networkv1.SetupResponse, error) {
	r, err := s.impl.Setup(ctx, &SetupRequest{Subnet: req.GetSubnet(), Gateway: req.GetGateway()})
	if err != nil {
		return nil, pluginapi.ToStatus(err)
	}
	if r == nil {
		return nil, pluginapi.ToStatus(abierrors.New(abierrors.Internal, "Setup returned no response"))
	}
	return &networkv1.SetupResponse{Gateway: r.Gateway}, nil
}

func (s *server) Attach(ctx context.Context, req *networkv1.AttachRequest) (*networkv1.AttachResponse, error) {
	r, err := s.impl.Attach(ctx, &AttachRequest{WorkloadID: req.GetWorkloadId(), Group: req.GetGroup(),
		Ports: portsFromProto(req.GetPorts()), Mutation: mutationFromProto(req.GetMutation())})
	if err != nil {
		return nil, pluginapi.ToStatus(err)
	}
	if r == nil {
		return nil, pluginapi.ToStatus(abierrors.New(abierrors.Internal, "Attach returned no attachment"))
	}
	return &networkv1.AttachResponse{Attachment: attachmentToProto(r)}, nil
}

func (s *server) Detach(ctx context.Context, req *networkv1.DetachRequest) (*networkv1.DetachResponse, error) {
	if err := s.impl.Detach(ctx, &DetachRequest{WorkloadID: req.GetWorkloadId(), Mutation: mutationFromProto(req.GetMutation())}); err != nil {
		return nil, pluginapi.ToStatus(err)
	}
	return &networkv1.DetachResponse{}, nil
}

func (s *server) List(ctx context.Context, _ *networkv1.ListRequest) (*networkv1.ListResponse, error) {
	r, err := s.impl.List(ctx)
	if err != nil {
		return nil, pluginapi.ToStatus(err)
	}
	out := &networkv1.ListResponse{}
	for _, a := range r {
		if a != nil {
			out.Attachments = append(out.Attachments, attachmentToProto(a))
		}
	}
	return out, nil
}

// Client is a Network over a gRPC connection to a plugin process. It also
// implements [pluginapi.HealthReporter]. Calls are bounded by the caller's
// ctx joined with the plugin's lifetime.
type Client struct {
	life   context.Context
	client networkv1.NodeNetworkClient
}

var (
	_ Network                  = (*Client)(nil)
	_ pluginapi.HealthReporter = (*Client)(nil)
)

// NewClient returns a client over conn. life is the plugin process's
// lifetime (go-plugin cancels it when the process exits); nil means none.
func NewClient(life context.Context, conn grpc.ClientConnInterface) *Client {
	if life == nil {
		life = context.Background()
	}
	return &Client{life: life, client: networkv1.NewNodeNetworkClient(conn)}
}

// Done returns a channel closed when the plugin process has exited.
func (c *Client) Done() <-chan struct{} { return c.life.Done() }

const errPrefix = "node network: "

// Describe implements Network.
func (c *Client) Describe(ctx context.Context) (*DescribeResponse, error) {
	ctx, cancel := pluginapi.Join(ctx, c.life)
	defer cancel()
	r, err := c.client.Describe(ctx, &pluginv1.DescribeRequest{})
	if err != nil {
		return nil, pluginapi.FromStatus(ctx, errPrefix+"describe", err)
	}
	out := &DescribeResponse{Name: r.GetName(), Version: r.GetVersion(), APIVersions: pluginapi.APIVersions(r.GetApiVersions())}
	return out, nil
}

// Health implements pluginapi.HealthReporter. The channel is closed when ctx
// ends or the plugin exits.
func (c *Client) Health(ctx context.Context) (<-chan pluginapi.HealthReport, error) {
	return pluginapi.WatchHealth(ctx, c.life, errPrefix+"health", func(ctx context.Context) (pluginapi.HealthStream, error) {
		return c.client.Health(ctx, &pluginv1.HealthRequest{})
	})
}

// Setup implements Network.
func (c *Client) Setup(ctx context.Context, req *SetupRequest) (*SetupResponse, error) {
	ctx, cancel := pluginapi.Join(ctx, c.life)
	defer cancel()
	r, err := c.client.Setup(ctx, &networkv1.SetupRequest{Subnet: req.Subnet, Gateway: req.Gateway})
	if err != nil {
		return nil, pluginapi.FromStatus(ctx, errPrefix+"setup", err)
	}
	return &SetupResponse{Gateway: r.GetGateway()}, nil
}

// Attach implements Network.
func (c *Client) Attach(ctx context.Context, req *AttachRequest) (*Attachment, error) {
	ctx, cancel := pluginapi.Join(ctx, c.life)
	defer cancel()
	r, err := c.client.Attach(ctx, &networkv1.AttachRequest{WorkloadId: req.WorkloadID, Group: req.Group,
		Ports: portsToProto(req.Ports), Mutation: mutationToProto(req.Mutation)})
	if err != nil {
		return nil, pluginapi.FromStatus(ctx, errPrefix+"attach workload "+req.WorkloadID, err)
	}
	return attachmentFromProto(r.GetAttachment()), nil
}

// Detach implements Network.
func (c *Client) Detach(ctx context.Context, req *DetachRequest) error {
	ctx, cancel := pluginapi.Join(ctx, c.life)
	defer cancel()
	if _, err := c.client.Detach(ctx, &networkv1.DetachRequest{WorkloadId: req.WorkloadID, Mutation: mutationToProto(req.Mutation)}); err != nil {
		return pluginapi.FromStatus(ctx, errPrefix+"detach workload "+req.WorkloadID, err)
	}
	return nil
}

// List implements Network.
func (c *Client) List(ctx context.Context) ([]*Attachment, error) {
	ctx, cancel := pluginapi.Join(ctx, c.life)
	defer cancel()
	r, err := c.client.List(ctx, &networkv1.ListRequest{})
	if err != nil {
		return nil, pluginapi.FromStatus(ctx, errPrefix+"list", err)
	}
	out := make([]*Attachment, 0, len(r.GetAttachments()))
	for _, a := range r.GetAttachments() {
		out = append(out, attachmentFromProto(a))
	}
	return out, nil
}

func portsToProto(ps []Port) []*networkv1.Port {
	out := make([]*networkv1.Port, 0, len(ps))
	for _, p := range ps {
		out = append(out, &networkv1.Port{HostPort: uint32(p.HostPort), ContainerPort: uint32(p.ContainerPort), Protocol: p.Protocol})
	}
	return out
}

func portsFromProto(ps []*networkv1.Port) []Port {
	out := make([]Port, 0, len(ps))
	for _, p := range ps {
		out = append(out, Port{HostPort: uint16(p.GetHostPort()), ContainerPort: uint16(p.GetContainerPort()), Protocol: p.GetProtocol()})
	}
	return out
}

func attachmentToProto(a *Attachment) *networkv1.Attachment {
	return &networkv1.Attachment{WorkloadId: a.WorkloadID, Group: a.Group, Address: a.Address, NetnsPath: a.NetNSPath, Ports: portsToProto(a.Ports)}
}

func attachmentFromProto(a *networkv1.Attachment) *Attachment {
	if a == nil {
		return nil
	}
	return &Attachment{WorkloadID: a.GetWorkloadId(), Group: a.GetGroup(), Address: a.GetAddress(), NetNSPath: a.GetNetnsPath(), Ports: portsFromProto(a.GetPorts())}
}

func mutationToProto(m pluginapi.Mutation) *pluginv1.Mutation {
	return &pluginv1.Mutation{OperationId: m.OperationID, IdempotencyKey: m.IdempotencyKey, FencingToken: m.FencingToken}
}

func mutationFromProto(m *pluginv1.Mutation) pluginapi.Mutation {
	return pluginapi.Mutation{OperationID: m.GetOperationId(), IdempotencyKey: m.GetIdempotencyKey(), FencingToken: m.GetFencingToken()}
}
