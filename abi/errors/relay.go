package errors

// Codes of clusters and the cluster relay (docs/relay.md).
const (
	// RelayProtocolUnsupported: the relay offered no protocol version this core speaks.
	RelayProtocolUnsupported Code = "relay_protocol_unsupported"
	// RelayHeaderInvalid: a relay stream opened with a malformed or oversized header; nothing of it was served.
	RelayHeaderInvalid Code = "relay_header_invalid"
	// RelayNotConnected: the cluster has no live registered relay, so nothing reaches its nodes (503).
	RelayNotConnected Code = "relay_not_connected"
	// RelayAmbiguous: two or more live relays are registered for one cluster; the core chooses
	// neither and carries no new node connection for the cluster until one is gone (409).
	RelayAmbiguous Code = "relay_ambiguous"
	// RelayCredentialStale: a relay presented a credential of a generation the cluster rotated
	// away, or learned that its accepted generation is no longer current; the relay parks (401).
	RelayCredentialStale Code = "relay_credential_stale"
	// RelayRegistrationRefused: the relay's registration was not accepted (its sequence did not
	// advance, a required field is missing or malformed, or the cluster has no relay) (409).
	RelayRegistrationRefused Code = "relay_registration_refused"
	// RelayClusterMismatch: a node or join token of one cluster came through the relay of another;
	// nothing of it was served (403).
	RelayClusterMismatch Code = "relay_cluster_mismatch"
	// RelayRequired: a node of a cluster that requires a relay dialled the core directly; its
	// session is not opened, and it keeps redialling until it is pointed at its relay (403).
	RelayRequired Code = "relay_required"
	// ClusterNotFound: no cluster of that name (404).
	ClusterNotFound Code = "cluster_not_found"
	// ClusterNoRelay: a relay credential asked for a cluster that does not use a relay (409).
	ClusterNoRelay Code = "cluster_no_relay"
)
