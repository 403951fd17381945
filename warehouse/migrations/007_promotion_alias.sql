-- kernelcast warehouse, version 7: a decision per champion alias. model_promotion decides
-- @champion (on in_distribution, vetoed by the other splits) and @champion-external (on external,
-- or source_only while external is empty) on every run; both are recorded, told apart by `alias`,
-- with the split they were decided on and the challenger alias each left behind.
-- Rows written before this migration are @champion decisions on in_distribution.
ALTER TABLE promotion_decisions ADD COLUMN alias VARCHAR DEFAULT 'champion';
ALTER TABLE promotion_decisions ADD COLUMN decided_on_split VARCHAR DEFAULT 'in_distribution';
ALTER TABLE promotion_decisions ADD COLUMN challenger_after VARCHAR;
