package acl

import "strings"

// verbSet is a set of verbs (docs/configuration.md "The ACL file"): what a rule allows on its
// subject.
type verbSet uint8

const (
	verbWrite verbSet = 1 << iota
	verbRead
	verbSeek
	verbDelete
	verbConsume
	verbDisconnect
)

// named is one bit of a set and its spelling in the file format.
type named struct {
	bit  uint8
	name string
}

// bitNamed is the bit spelled name in table.
func bitNamed(table []named, name string) (uint8, bool) {
	for _, x := range table {
		if x.name == name {
			return x.bit, true
		}
	}
	return 0, false
}

// bitNames lists the spellings of set's bits in table's order; never nil,
// so that a JSON list is [] rather than null.
func bitNames(table []named, set uint8) []string {
	out := []string{}
	for _, x := range table {
		if set&x.bit != 0 {
			out = append(out, x.name)
		}
	}
	return out
}

// verbOrder is the one order verbs are listed in, everywhere.
var verbOrder = []named{
	{uint8(verbWrite), "write"}, {uint8(verbRead), "read"}, {uint8(verbSeek), "seek"},
	{uint8(verbDelete), "delete"}, {uint8(verbConsume), "consume"}, {uint8(verbDisconnect), "disconnect"},
}

func verbNamed(name string) (verbSet, bool) {
	v, ok := bitNamed(verbOrder, name)
	return verbSet(v), ok
}

// names lists the set's verbs in verbOrder; never nil.
func (s verbSet) names() []string { return bitNames(verbOrder, uint8(s)) }

// verbsOf is what each subject takes (docs/configuration.md "The ACL file"): the channel types,
// a topic: rule and broker: sessions. broker: features takes no verb.
var verbsOf = map[string]verbSet{
	"append":   verbWrite | verbRead | verbSeek,
	"latest":   verbWrite | verbRead | verbDelete,
	"queue":    verbWrite | verbConsume,
	"topic":    verbWrite | verbRead,
	"sessions": verbDisconnect,
}

// wholeChannelVerbs act on a channel rather than on a topic of it: a seek
// moves the session's position in the whole channel, and a worker is
// offered any job of its queue. A filter cannot narrow them (rfcs/acl.md).
const wholeChannelVerbs = verbSeek | verbConsume

// wrongVerb says why subject (a channel type, "topic" or "sessions") does
// not take verb, and what it takes.
func wrongVerb(verb, subject string) string {
	takes := strings.Join(verbsOf[subject].names(), ", ")
	switch {
	case verb == "read" && subject == "queue":
		return "a queue is not read: each job goes to one worker, which consumes it; write consume (a worker subscribes $saguin/queue/<queue>)"
	case verb == "seek" && subject == "latest":
		return "a latest channel keeps one value per topic and has no position to move; it takes " + takes
	case verb == "delete" && subject == "append":
		return "records of an append channel are not deleted by clients (retention removes them); it takes " + takes
	case verb == "consume":
		return "only a queue is consumed; a " + subjectName(subject) + " takes " + takes
	case verb == "disconnect":
		return "disconnect is granted by a broker: sessions rule; a " + subjectName(subject) + " takes " + takes
	}
	return verb + " is not a verb of a " + subjectName(subject) + "; it takes " + takes
}

func subjectName(subject string) string {
	switch subject {
	case "topic":
		return "topic: rule (broadcast topics)"
	case "sessions":
		return "broker: sessions rule"
	}
	return subject + " channel"
}

// Feature is a broker feature a broker: features rule may deny; a
// Feature value may hold several (a set).
type Feature uint8

// The features docs/configuration.md "The ACL file" lets a role deny; what each denial does on
// the wire is §3.6's, the broker's.
const (
	Persistent Feature = 1 << iota // a session outliving its connection
	Will                           // a Will message
	Share                          // shared subscriptions
	Retained                       // retained broadcast publishes
	QoS2                           // exactly-once
)

var featureOrder = []named{
	{uint8(Persistent), "persistent"}, {uint8(Will), "will"}, {uint8(Share), "share"},
	{uint8(Retained), "retained"}, {uint8(QoS2), "qos2"},
}

func featureNamed(name string) (Feature, bool) {
	f, ok := bitNamed(featureOrder, name)
	return Feature(f), ok
}

// Names lists the features in the set, in the file format's spelling;
// never nil.
func (f Feature) Names() []string { return bitNames(featureOrder, uint8(f)) }

func featureNames() []string { return Feature(0xff).Names() }
