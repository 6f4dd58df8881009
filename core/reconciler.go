package core

import "context"

// A Grant is one request admitted without the shared store, kept in the
// outage log until it is folded back into the store.
type Grant struct {
	// Key is the storage key (see StorageKey).
	Key string
	// Policy is the policy that admitted it.
	Policy Policy
	// ID is the request's unique id.
	ID string
	// Cost is what the request spent.
	Cost int64
	// At is when it was admitted, in the store's clock (microseconds since the
	// Unix epoch), converted with the instance's tracked clock offset.
	At int64
}

// A Batch is a set of grants replayed into the store as one idempotent unit.
type Batch struct {
	// ID names the batch uniquely: instance, outage epoch and sequence. The
	// store marks it applied in the same atomic step that applies it, so a
	// retried batch counts once.
	ID string
	// Grants are the batch's grants, all for one storage key, in time order.
	Grants []Grant
}

// A Reconciler folds an outage log back into the shared store.
type Reconciler interface {
	// Reconcile applies each batch exactly once. It returns the number of
	// batches acknowledged by the store; the caller clears only those.
	Reconcile(ctx context.Context, store Store, batches []Batch) (applied int, err error)
}
