package node

// DNS-01 challenges written by the core for a node (docs/node-protocol.md section 6.8).
const (
	TypeDNSChallenge       Type = "dns_challenge"        // node to core
	TypeDNSChallengeResult Type = "dns_challenge_result" // core to node; answers a dns_challenge
)

// DNS challenge actions.
const (
	DNSChallengeSet   = "set"
	DNSChallengeClear = "clear"
)

// DNSChallenge asks the core to set or clear the TXT record
// _acme-challenge.<Hostname> holding Value (section 6.8). Hostname must be an
// acme route of the node's current desired state; the node never names the
// record itself.
type DNSChallenge struct {
	Action   string `json:"action"`   // DNSChallengeSet or DNSChallengeClear
	Hostname string `json:"hostname"` // e.g. "blog.example.com" or "*.example.com"
	Value    string `json:"value"`    // the key authorization digest, 1 to 255 bytes
}

// DNSChallengeResult answers a DNSChallenge (re = its id). OK reports whether
// the DNS server holds (set) or no longer holds (clear) the value; RecordID
// names the record written. A refusal carries Code (from abi/errors, e.g.
// dns_challenge_host_unknown) and Message.
type DNSChallengeResult struct {
	OK       bool   `json:"ok"`
	RecordID string `json:"record_id,omitempty"`
	Code     string `json:"code,omitempty"`
	Message  string `json:"message,omitempty"`
}
