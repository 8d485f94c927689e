package runbox

import (
	"regexp"
	"strings"
)

// DefaultClient is the client of the single token MCP_API_TOKEN (and of
// stdio).
const DefaultClient = "default"

var namePattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// ValidConversationID reports whether id may name a conversation. Such an
// id is also a safe single path element.
func ValidConversationID(id string) bool { return namePattern.MatchString(id) }

// ValidClientName reports whether name may name a client.
func ValidClientName(name string) bool { return namePattern.MatchString(name) }

// A conversation belongs to the client that made it: the same id from two
// clients names two conversations. Inside the service (Redis keys,
// folders, sandboxes) a conversation is named by its key: the id itself
// for the client "default", so that a deployment with one token keeps its
// folders and download links, and "~<client>~<id>" for any other. No id
// contains '~', so no key of one client can name another's conversation.

// ConversationKey returns the key of a client's conversation. The id must
// be valid: an error says which rule it breaks.
func ConversationKey(client, id string) (string, error) {
	if !ValidConversationID(id) {
		return "", Errorf(EInvalid, "conversationId must be 1 to 64 letters, digits, '_' or '-'")
	}
	if client == "" || client == DefaultClient {
		return id, nil
	}
	return "~" + client + "~" + id, nil
}

// ParseConversationKey returns the client and id a key names.
func ParseConversationKey(key string) (client, id string, ok bool) {
	rest, named := strings.CutPrefix(key, "~")
	if !named {
		return DefaultClient, key, ValidConversationID(key)
	}
	client, id, found := strings.Cut(rest, "~")
	if !found || !ValidClientName(client) || client == DefaultClient || !ValidConversationID(id) {
		return "", "", false
	}
	return client, id, true
}

// ValidConversationKey reports whether key names a conversation. Such a
// key is also a safe single path element.
func ValidConversationKey(key string) bool {
	_, _, ok := ParseConversationKey(key)
	return ok
}

// ConversationURLPath is how a key appears in download URLs: "<id>", or
// "~<client>/<id>".
func ConversationURLPath(key string) string {
	client, id, ok := ParseConversationKey(key)
	if !ok || client == DefaultClient {
		return key
	}
	return "~" + client + "/" + id
}

// Mark is what a conversation looks like at a moment, to tell whether it
// changed while it was being forked.
type Mark struct {
	Known   bool   // used (a run, an upload) within the retention
	Busy    bool   // a run queued or running
	LastRun string // its newest run
	// Files is the version of its files in a remote file store (0 with
	// the host folder, whose writers a fork locks out).
	Files int64
}
