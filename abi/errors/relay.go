package errors

// Codes of the cluster relay's transport (docs/relay.md).
const (
	// RelayProtocolUnsupported: the relay offered no protocol version this core speaks.
	RelayProtocolUnsupported Code = "relay_protocol_unsupported"
	// RelayHeaderInvalid: a relay stream opened with a malformed or oversized header; nothing of it was served.
	RelayHeaderInvalid Code = "relay_header_invalid"
)
