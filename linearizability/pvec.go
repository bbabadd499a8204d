package linearizability

// pvec is a persistent (immutable) vector: a 32-way trie whose append copies
// only the path to the new slot. Porcupine keeps every state it has visited in
// its cache and never lets Step mutate one, so an append channel's log, copied
// whole at every publish, would cost O(n) per step and O(n^2) per history;
// this makes a publish O(log32 n) and lets equal prefixes share memory — which
// also makes Equal cheap, since shared subtrees compare by pointer.

const (
	pvBits  = 5
	pvWidth = 1 << pvBits
	pvMask  = pvWidth - 1
)

type logRec struct {
	id      string
	payload string
	lossCut int // the power cut that may drop this record (0: none)
}

type pnode struct {
	kids []*pnode  // interior node
	recs []*logRec // leaf: pointers, so a push copies 8 bytes per record
}

type pvec struct {
	root  *pnode
	n     int
	shift uint   // depth of the trie above the leaves, in bits
	hash  uint64 // order-sensitive hash of the contents
}

func (v pvec) len() int { return v.n }

// get returns element i (0-based); i must be < n.
func (v pvec) get(i int) logRec {
	nd := v.root
	for s := v.shift; s > 0; s -= pvBits {
		nd = nd.kids[(i>>s)&pvMask]
	}
	return *nd.recs[i&pvMask]
}

func (v pvec) push(r logRec) pvec {
	out := v
	if v.root == nil {
		out.root = &pnode{}
	} else if v.n == 1<<(v.shift+pvBits) {
		// Full: grow a level.
		out.root = &pnode{kids: []*pnode{v.root}}
		out.shift = v.shift + pvBits
	}
	out.root = pushAt(out.root, out.shift, v.n, r)
	out.n = v.n + 1
	out.hash = mixHash(v.hash, r)
	return out
}

func pushAt(nd *pnode, shift uint, i int, r logRec) *pnode {
	cp := &pnode{}
	if nd != nil {
		*cp = *nd
	}
	if shift == 0 {
		cp.recs = append(append(make([]*logRec, 0, len(cp.recs)+1), cp.recs...), &r)
		return cp
	}
	k := (i >> shift) & pvMask
	kids := make([]*pnode, max(len(cp.kids), k+1))
	copy(kids, cp.kids)
	kids[k] = pushAt(kids[k], shift-pvBits, i, r)
	cp.kids = kids
	return cp
}

// truncate returns the first n elements. Rebuilding is O(n), but it runs only
// at a power cut, on the few records its loss window covers.
func (v pvec) truncate(n int) pvec {
	if n >= v.n {
		return v
	}
	var out pvec
	for i := range n {
		out = out.push(v.get(i))
	}
	return out
}

func (v pvec) equal(w pvec) bool {
	return v.n == w.n && v.hash == w.hash && v.shift == w.shift && nodeEqual(v.root, w.root)
}

func nodeEqual(a, b *pnode) bool {
	if a == b {
		return true
	}
	if a == nil || b == nil || len(a.kids) != len(b.kids) || len(a.recs) != len(b.recs) {
		return false
	}
	for i := range a.recs {
		if a.recs[i] != b.recs[i] && *a.recs[i] != *b.recs[i] {
			return false
		}
	}
	for i := range a.kids {
		if !nodeEqual(a.kids[i], b.kids[i]) {
			return false
		}
	}
	return true
}

// mixHash folds one record into an order-sensitive FNV-1a style hash.
func mixHash(h uint64, r logRec) uint64 {
	const prime = 1099511628211
	if h == 0 {
		h = 14695981039346656037
	}
	for i := 0; i < len(r.id); i++ {
		h = (h ^ uint64(r.id[i])) * prime
	}
	h = (h ^ 0xff) * prime
	for i := 0; i < len(r.payload); i++ {
		h = (h ^ uint64(r.payload[i])) * prime
	}
	h = (h ^ uint64(r.lossCut) ^ 0xfe) * prime
	return h
}
