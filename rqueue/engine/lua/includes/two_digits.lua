--[[
  Seqs as text without a sprintf each. Lua turns a number into a string
  with sprintf, about 1,700 Redis instructions a seq in string.format
  (benchmarks/icount.py); a run of rising seqs of 100 or more is written as
  its hundreds, formatted once per hundred, and two digits from a table.
]]

-- The digits "00" to "99", at index (seq mod 100) + 1. A function, so that
-- a call builds the table only where it writes a run of seqs.
local function twoDigits()
  return {
    '00', '01', '02', '03', '04', '05', '06', '07', '08', '09', '10', '11', '12', '13', '14', '15', '16', '17', '18', '19',
    '20', '21', '22', '23', '24', '25', '26', '27', '28', '29', '30', '31', '32', '33', '34', '35', '36', '37', '38', '39',
    '40', '41', '42', '43', '44', '45', '46', '47', '48', '49', '50', '51', '52', '53', '54', '55', '56', '57', '58', '59',
    '60', '61', '62', '63', '64', '65', '66', '67', '68', '69', '70', '71', '72', '73', '74', '75', '76', '77', '78', '79',
    '80', '81', '82', '83', '84', '85', '86', '87', '88', '89', '90', '91', '92', '93', '94', '95', '96', '97', '98', '99',
  }
end
