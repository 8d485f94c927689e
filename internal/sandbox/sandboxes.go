package sandbox

// Sandboxes returns the ids of a conversation's live sandboxes: a preview
// URL serves while one of those it was issued for lives.
func (m *Manager) Sandboxes(conversation string) []string {
	var ids []string
	for _, sb := range m.sandboxesOf(conversation) {
		ids = append(ids, sb.id)
	}
	return ids
}
