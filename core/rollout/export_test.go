package rollout

// SetBeforeCommit makes p call f before each commit re-reads its slot (tests race it).
func SetBeforeCommit(p *Producer, f func()) { p.beforeCommit = f }
