-- The prices a job was held at, which it is charged at whatever a reload changed meanwhile
-- (Job.prices: JSON text, money as decimal strings; NULL in a job recorded before: the model's now).
ALTER TABLE jobs ADD COLUMN prices text;
