package clusters

import "context"

// Carrier is the identity of the relay a connection came through (docs/relay.md section 10):
// berthd puts it in the context of every connection it serves on a relay's stream, and the
// node-session, enrollment and registry handlers compare it with what the node proves.
type Carrier struct {
	// Cluster is the cluster whose relay credential the relay's session authenticated with.
	Cluster string
	// RelayID and Session name the relay's registration the stream was opened under.
	RelayID string
	Session uint64
	// RemoteAddr is the node connection's address as the relay saw it.
	RemoteAddr string
}

type carrierKey struct{}

// WithCarrier returns ctx carrying c.
func WithCarrier(ctx context.Context, c Carrier) context.Context {
	return context.WithValue(ctx, carrierKey{}, c)
}

// CarrierFrom returns the relay a request came through, and false for a direct connection.
func CarrierFrom(ctx context.Context) (Carrier, bool) {
	c, ok := ctx.Value(carrierKey{}).(Carrier)
	return c, ok
}
