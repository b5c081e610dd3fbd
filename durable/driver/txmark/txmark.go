// Package txmark ties a store to its transaction type. durable.Store embeds
// [Marked], whose one method is unexported here: only a type that embeds
// [Mark] (a backend of this module) implements durable.Store, and TTx
// appears in the interface's method set, so claim.New infers it and a store
// of one backend cannot be passed as a store of another.
//
// It is part of oncekey's unstable module seam (package driver): not for
// applications, no compatibility promise between versions.
package txmark

// Marked is implemented by a type that embeds Mark[TTx].
type Marked[TTx any] interface {
	oncekeyTx(TTx)
}

// Mark is embedded by the stores of this module, with their transaction
// type.
type Mark[TTx any] struct{}

func (Mark[TTx]) oncekeyTx(TTx) {}
