package lockorder

import (
	"slices"
	"testing"
)

// Each function of testdata/features says whether the walk should find
// inner.mu held while outer.mu (or, through the interface, inner.mu) is
// taken; this holds the walk to it.
func TestWalkFollowsWhatItSaysItFollows(t *testing.T) {
	p, err := Load("testdata/features")
	if err != nil {
		t.Fatal(err)
	}
	res := Check(p, Order{"outer.mu": 1, "inner.mu": 2})
	var got []string
	for _, f := range res.Findings {
		got = append(got, f.Func+": "+f.Held+" → "+f.Taken)
		t.Log(f)
	}
	want := []string{
		"inner.viaArgument: inner.mu → outer.mu",
		"inner.viaInterface: inner.mu → inner.mu",
		"inner.viaParameter: inner.mu → outer.mu",
	}
	if !slices.Equal(got, want) {
		t.Errorf("findings\n%q\nwant\n%q", got, want)
	}
}
