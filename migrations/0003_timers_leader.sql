-- Finding a timer's occurrences that have not fired yet, to remove them when the timer
-- changes; partial, so it holds only pending occurrences.
CREATE INDEX tasks_timer_idx ON tasks (timer_id) WHERE status = 'pending' AND timer_id IS NOT NULL;
CREATE INDEX tasks_cold_timer_idx ON tasks_cold (timer_id) WHERE timer_id IS NOT NULL;

-- The leader's question every second: which active timers need occurrences written.
CREATE INDEX timers_due_idx ON timers (materialized_until) WHERE active;
