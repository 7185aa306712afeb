package slots

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestPolicyDeniedReason(t *testing.T) {
	for _, c := range []struct {
		in   []string
		want Reason
	}{
		{nil, ReasonPolicyDenied},
		{[]string{" ", ""}, ReasonPolicyDenied},
		{[]string{"bundle web is not named by digest"}, "policy-denied: bundle web is not named by digest"},
		{[]string{"a", " b "}, "policy-denied: a; b"},
	} {
		if got := PolicyDeniedReason(c.in); got != c.want || !IsPolicyDenied(got) {
			t.Errorf("PolicyDeniedReason(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	long := PolicyDeniedReason([]string{strings.Repeat("é", MaxPolicyReasonBytes)})
	text := strings.TrimPrefix(string(long), "policy-denied: ")
	if !strings.HasSuffix(text, "...") || len(text) > MaxPolicyReasonBytes+3 || !utf8.ValidString(text) {
		t.Errorf("long reason not cut at a character boundary: %d bytes, valid %v", len(text), utf8.ValidString(text))
	}
	if IsPolicyDenied("policy-deniedx") || IsPolicyDenied(ReasonConflict) {
		t.Error("IsPolicyDenied matches another reason")
	}
}

func TestAdmissionVerdictPrecedence(t *testing.T) {
	denied := PolicyDeniedReason([]string{"no"})
	for _, c := range []struct {
		name   string
		v      Verdict
		reason Reason
		want   Verdict
	}{
		{"no hold", Verdict{SpecRevision: 2, State: Converging}, "", Verdict{SpecRevision: 2, State: Converging}},
		{"denied", Verdict{SpecRevision: 2, State: Converging}, denied, Verdict{SpecRevision: 2, State: Refused, Reason: denied}},
		{"over conflict", Verdict{SpecRevision: 2, State: Waiting, Reason: ReasonConflict}, denied, Verdict{SpecRevision: 2, State: Refused, Reason: denied}},
		{"unavailable", Verdict{SpecRevision: 2, State: Converging}, ReasonPolicyUnavailable, Verdict{SpecRevision: 2, State: Waiting, Reason: ReasonPolicyUnavailable}},
		{"refusal stands", Verdict{SpecRevision: 2, State: Refused, Reason: ReasonNoEligibleNode}, denied, Verdict{SpecRevision: 2, State: Refused, Reason: ReasonNoEligibleNode}},
	} {
		if got := AdmissionVerdict(c.v, c.reason); got != c.want {
			t.Errorf("%s: AdmissionVerdict = %s, want %s", c.name, got, c.want)
		}
	}
}
