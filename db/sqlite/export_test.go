package sqlite

// PreparedStatements is how many statements the engine's batches of checks keep prepared.
func (e *Engine) PreparedStatements() int {
	e.stmts.mu.Lock()
	defer e.stmts.mu.Unlock()
	return len(e.stmts.stmts)
}
