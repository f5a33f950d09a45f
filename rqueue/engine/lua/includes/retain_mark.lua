--[[
  The meta hash field that puts a queue in retention mode: while it is
  there, settling deletes no record and leaves the trim point alone; the
  trim step (includes/retention.lua, run by retain.lua) deletes records, and
  only those every group settled (at or below the lowest ack floor). Its
  value is the retention in force, "<max_age_ms> <max_length>", each "-"
  when unset ("- -": no retention, but settled records are still deleted by
  the trim step alone, after a group was created at a position, reset or
  deleted: the counts in the settled hash no longer say which groups
  settled a seq).
]]
local RETAIN = 'retain'
